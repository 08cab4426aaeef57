"""A real daemon (a process, the real broker, the tiny model) whose checkpoint store someone else has
written to, on a shared folder and on moto's S3 server: manifests naming '..' or an absolute path, a
link out of the shared folder, a forged and a malformed succeeded.json, and a forged checkpoint-999
with planted weights. Each is written both as manifests were before signing (what any writer of the
store can write) and, where the names or links are the point, signed with the fleet's own key (the
checks of names and links hold even then). Every request trains honestly from its first step,
nothing lands outside the job's folder, and what is pushed and signed `succeeded` is that training's."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from daemon.settings import Settings
from daemon.store.checkpoints import SUCCEEDED, CheckpointStore
from daemon.store.opening import store_of
from schemas import Progress, Started, Succeeded
from testbed.client import submit, terminal_events
from testbed.data import CHAT_ROWS
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.conftest import S3_CREDENTIALS
from tests.daemon.storage.test_store_trust import plant, put, signing_in
from tests.helpers import event_document, fleet_key, sft_request

pytestmark = pytest.mark.slow

PLANTED = b"planted adapter weights " * 64


def with_store(
    settings: Settings, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[Settings, dict[str, str]]:
    """The settings with a store of `backend` and the fleet's key; the environment the daemon needs for it."""
    store: dict[str, object] = {"checkpoint_store": str(tmp_path / "fleet" / "store" / "checkpoints")}
    env: dict[str, str] = {}
    if backend == "s3":
        import boto3

        endpoint = request.getfixturevalue("s3_endpoint")
        env = S3_CREDENTIALS
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        if "trust" not in [bucket["Name"] for bucket in client.list_buckets()["Buckets"]]:
            client.create_bucket(Bucket="trust")
        store = {
            "checkpoint_store": f"s3://trust/{settings.group_id}",
            "dataset_storage_options": {"s3": {"client_kwargs": {"endpoint_url": endpoint}}},
        }
    return settings.model_copy(update={**store, "event_signing_key_file": fleet_key(tmp_path / "fleet")}), env


def plant_all(store: CheckpointStore, backend: str, ids: dict[str, str], tmp_path: Path) -> Path:
    """Every case's planting; the absolute path one of them names."""
    fleet, intruder = signing_in(tmp_path / "fleet"), signing_in(tmp_path / "intruder")
    absolute = tmp_path / "absolute-target" / "planted.pth"
    # from the download's folder in work_dir/jobs/ID/checkpoints: work_dir/outside
    outside = "../../../../outside/planted.pth"
    paths = ids["paths"]
    plant(store, paths, 999, {outside: PLANTED})
    plant(store, paths, 998, {outside: PLANTED}, signing=fleet)
    plant(store, paths, 997, {str(absolute): PLANTED})
    plant(store, paths, 996, {str(absolute): PLANTED}, signing=fleet)
    if backend == "folder":
        secret = tmp_path / "secret.pth"
        secret.write_bytes(PLANTED)
        for step, signing in ((995, None), (994, fleet)):
            plant(store, paths, step, {"adapter_model.safetensors": PLANTED}, signing=signing)
            link = Path(store.path(paths, f"checkpoint-{step}", "adapter_model.safetensors"))
            link.unlink()
            link.symlink_to(secret)
    forged = ids["forged-checkpoint"]
    weights = {"adapter_model.safetensors": PLANTED, "trainer_state.json": json.dumps({"global_step": 999}).encode()}
    plant(store, forged, 999, weights)  # a manifest that matches the planted weights, unsigned
    plant(store, forged, 998, weights, signing=intruder)  # and one signed by a key that is not the fleet's
    succeeded = event_document(
        "succeeded",
        request_id=ids["forged-succeeded"],
        repo_id="intruder/weights",
        commit_sha="f" * 40,
        commit_url="https://huggingface.co/intruder/weights/commit/" + "f" * 40,
    )
    put(store, store.path(ids["forged-succeeded"], SUCCEEDED), json.dumps(succeeded).encode())
    put(store, store.path(ids["malformed-succeeded"], SUCCEEDED), json.dumps({"hello": "not an event"}).encode())
    return absolute


@pytest.mark.parametrize("backend", ["folder", "s3"])
async def test_what_others_wrote_to_the_store_is_never_trained_from_written_out_or_answered_with(
    settings: Settings,
    published: HubServer,
    tmp_path: Path,
    backend: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings, env = with_store(settings, backend, tmp_path, request)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = store_of(settings)
    assert store is not None
    ids = {
        case: f"trust-{backend}-{case}"
        for case in ("paths", "forged-checkpoint", "forged-succeeded", "malformed-succeeded")
    }
    absolute = plant_all(store, backend, ids, tmp_path)
    requests = {rid: sft_request(rid, dataset={"rows": CHAT_ROWS}) for rid in ids.values()}

    daemon = DaemonProcess(settings, tmp_path / "daemon.log", extra_env=env).start()
    try:
        for body in requests.values():
            await submit(settings, body)
        events = await terminal_events(settings, set(requests))
    finally:
        daemon.stop()

    for case, request_id in ids.items():
        succeeded = events[request_id][-1]
        assert isinstance(succeeded, Succeeded) and not succeeded.duplicate, (case, succeeded)
        [commit] = published.commits(f"results/{request_id}")  # trained and pushed once, by this daemon
        assert (succeeded.repo_id, succeeded.commit_sha, succeeded.published) == (
            f"results/{request_id}",
            commit.sha,
            "main",
        ), case
        assert commit.files.get("adapter_model.safetensors") not in (None, PLANTED), case
        [started] = [event for event in events[request_id] if isinstance(event, Started)]
        assert (started.resumed_step, started.resumed_from) == (None, None), case  # nothing resumed from the store
        assert [event.step for event in events[request_id] if isinstance(event, Progress)] == [1, 2, 3, 4], case
        assert store.succeeded(request_id) == json.loads(succeeded.model_dump_json()), (
            case
        )  # the fleet's own, signed, in its place
    assert not (settings.work_dir / "outside").exists() and not absolute.exists()
    planted = hashlib.sha256(PLANTED).hexdigest()
    assert [
        str(path)
        for path in settings.work_dir.rglob("*")
        if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == planted
    ] == []
    reasons = {line["reason"] for line in daemon.log_lines() if line.get("event") == "checkpoint_store.untrusted"}
    assert {"unsigned", "unsafe_name", "unknown_key"} <= reasons and ("link" in reasons or backend == "s3"), reasons
