"""The checkpoint store as a trust boundary, in process, on a shared folder and on moto's S3 server:
a manifest's names are paths inside its checkpoint (no '..', no absolute path, no link followed on
either side), a manifest or succeeded.json counts only when the fleet signed it for that request,
step and kind, and what a store lists is bounded. What fails is skipped, said and counted, and the
request resumes from the previous whole checkpoint or starts over (docs/guarantees.md, "Whom to trust")."""

from __future__ import annotations

import io
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from daemon.job.uploads import fetch
from daemon.settings import Settings
from daemon.store import documents as store_documents
from daemon.store.checkpoints import MANIFEST, SUCCEEDED, CheckpointStore, Manifest, StoreError
from daemon.store.documents import StoreSigning, seal
from daemon.store.download import download
from daemon.store.host_checkpoints import bounded_copy, local_checkpoints, write_new
from daemon.store.opening import store_signing
from tests.conftest import S3_CREDENTIALS
from tests.daemon.storage.test_checkpoint_store import BUCKET, make_checkpoint
from tests.helpers import fleet_key


def signing_in(folder: Path) -> StoreSigning:
    made = store_signing(Settings(event_signing_key_file=fleet_key(folder)))
    assert made is not None
    return made


@pytest.fixture
def fleet(tmp_path: Path) -> StoreSigning:
    return signing_in(tmp_path / "fleet")


@pytest.fixture(params=["folder", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path, fleet: StoreSigning) -> Iterator[CheckpointStore]:
    prefix = f"run-{uuid.uuid4().hex[:8]}"
    if request.param == "folder":
        yield CheckpointStore(str(tmp_path / "shared" / prefix), {}, host="host-a", signing=fleet)
        return
    import boto3

    endpoint = request.getfixturevalue("s3_endpoint")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in S3_CREDENTIALS.items():
            patch.setenv(name, value)
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        if BUCKET not in [bucket["Name"] for bucket in client.list_buckets()["Buckets"]]:
            client.create_bucket(Bucket=BUCKET)
        yield CheckpointStore(
            f"s3://{BUCKET}/{prefix}",
            {"s3": {"client_kwargs": {"endpoint_url": endpoint}}},
            host="host-a",
            signing=fleet,
        )


def untrusted(reason: str) -> float:
    return REGISTRY.get_sample_value("adapterd_checkpoint_store_untrusted_total", {"reason": reason}) or 0.0


def put(store: CheckpointStore, path: str, data: bytes) -> None:
    store.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)  # a shared folder needs it; object stores ignore it
    store.fs.pipe_file(path, data)


def plant(
    store: CheckpointStore,
    request_id: str,
    step: int,
    files: dict[str, bytes],
    *,
    signing: StoreSigning | None = None,
    manifest: dict[str, Any] | None = None,
) -> None:
    """What a writer of the store leaves there: the files and a manifest listing them (its own sizes
    and sha256), in the envelope `signing` seals, or, without it, as the manifest was before signing."""
    import hashlib

    for name, data in files.items():
        put(store, store.path(request_id, f"checkpoint-{step}", name), data)
    document = manifest or {
        "step": step,
        "host": "intruder",
        "written_at": time.time(),  # fresh: retention leaves it
        "files": {
            name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()
        },
    }
    raw = seal(signing, "manifest", request_id, step, document) if signing else json.dumps(document).encode()
    put(store, store.path(request_id, f"checkpoint-{step}", MANIFEST), raw)


def honest(store: CheckpointStore, tmp_path: Path, request_id: str, step: int) -> None:
    store.upload(request_id, make_checkpoint(tmp_path / f"saved-{uuid.uuid4().hex[:6]}", step), step)


def nothing_planted(root: Path) -> None:
    assert [str(path) for path in root.rglob("planted*")] == []


@pytest.mark.parametrize(
    "name",
    [
        "../../outside/planted.pth",
        "../planted.pth",
        "nested/../../planted.pth",
        "ABSOLUTE",
        "a//planted.pth",
        "./planted.pth",
        "nested\\..\\planted.pth",
    ],
)
def test_a_manifest_naming_a_path_outside_its_checkpoint_is_skipped_even_signed(
    store: CheckpointStore,
    fleet: StoreSigning,
    tmp_path: Path,
    name: str,
) -> None:
    name = str(tmp_path / "elsewhere" / "planted.pth") if name == "ABSOLUTE" else name
    honest(store, tmp_path, "req", 5)
    before = untrusted("unsafe_name")
    # Signed by the fleet's key (a host's bug, a key that leaked): the names are checked all the same.
    plant(store, "req", 9, {name: b"planted weights", "adapter_model.safetensors": b"w"}, signing=fleet)
    assert [manifest.step for manifest in store.complete("req")] == [5]
    assert untrusted("unsafe_name") == before + 1
    checkpoints = tmp_path / "host" / "jobs" / "req" / "checkpoints"
    assert fetch(store, "req", checkpoints) == (5, "store")  # the previous whole checkpoint
    nothing_planted(tmp_path / "host")
    assert not (tmp_path / "elsewhere").exists()


def test_a_download_checks_names_before_it_writes_anything(store: CheckpointStore, tmp_path: Path) -> None:
    forged = Manifest(3, store.url + "/req/checkpoint-3", {"../../planted.pth": (3, "0" * 64)}, 0.0)
    with pytest.raises(StoreError, match="unsafe_name"):
        download(store, "req", forged, tmp_path / "checkpoints")
    nothing_planted(tmp_path)
    assert local_checkpoints(tmp_path / "checkpoints") == {}


def test_unsigned_forged_and_misplaced_manifests_are_skipped_for_the_previous_whole_one(
    store: CheckpointStore,
    fleet: StoreSigning,
    tmp_path: Path,
) -> None:
    honest(store, tmp_path, "req", 5)
    weights = {"adapter_model.safetensors": b"planted weights"}
    plant(store, "req", 999, weights)  # as manifests were before signing: an old checkpoint, or anyone's
    plant(store, "req", 998, weights, signing=signing_in(tmp_path / "intruder"))  # another key
    honest(store, tmp_path, "other", 997)  # a genuine checkpoint of another request...
    raw = store.fs.cat_file(store.path("other", "checkpoint-997", MANIFEST))
    for name in ("adapter_model.safetensors", "nested/optimizer.pt", "trainer_state.json"):
        put(
            store,
            store.path("req", "checkpoint-997", name),
            store.fs.cat_file(store.path("other", "checkpoint-997", name)),
        )
    put(store, store.path("req", "checkpoint-997", MANIFEST), raw)  # ...copied to this one
    honest(store, tmp_path, "req", 6)  # a genuine checkpoint of this request, at step 6...
    for name in ("adapter_model.safetensors", "nested/optimizer.pt", "trainer_state.json"):
        put(
            store, store.path("req", "checkpoint-996", name), store.fs.cat_file(store.path("req", "checkpoint-6", name))
        )
    envelope = json.loads(store.fs.cat_file(store.path("req", "checkpoint-6", MANIFEST)))
    put(
        store, store.path("req", "checkpoint-996", MANIFEST), json.dumps({**envelope, "step": 996}).encode()
    )  # ...made to say 996
    tampered = json.loads(store.fs.cat_file(store.path("req", "checkpoint-5", MANIFEST)))
    tampered["document"] = tampered["document"].replace('"host": "host-a"', '"host": "host-b"')
    put(store, store.path("req", "checkpoint-995", MANIFEST), json.dumps({**tampered, "step": 995}).encode())

    counts = {reason: untrusted(reason) for reason in ("unsigned", "unknown_key", "misplaced", "bad_signature")}
    assert [manifest.step for manifest in store.complete("req")] == [6, 5]
    assert {reason: untrusted(reason) - count for reason, count in counts.items()} == {
        "unsigned": 1,
        "unknown_key": 1,
        "misplaced": 1,
        "bad_signature": 2,
    }
    checkpoints = tmp_path / "host"
    assert fetch(store, "req", checkpoints) == (6, "store")
    assert (checkpoints / "checkpoint-6" / "trainer_state.json").read_text() == json.dumps({"global_step": 6})


def test_a_store_with_no_signed_checkpoint_trains_from_the_start(store: CheckpointStore, tmp_path: Path) -> None:
    plant(store, "req", 999, {"adapter_model.safetensors": b"planted weights"})
    assert store.complete("req") == [] and fetch(store, "req", tmp_path / "host") is None


def test_succeeded_counts_only_when_the_fleet_signed_it_for_this_request(
    store: CheckpointStore, tmp_path: Path
) -> None:
    event = {"type": "succeeded", "request_id": "req", "repo_id": "theirs/repo", "commit_sha": "f" * 40}
    put(store, store.path("req", SUCCEEDED), json.dumps(event).encode())  # as written before signing: anyone's
    put(store, store.path("junk", SUCCEEDED), json.dumps({"hello": 1}).encode())
    put(store, store.path("cut", SUCCEEDED), b'{"type": "succ')
    before = {reason: untrusted(reason) for reason in ("unsigned", "malformed", "misplaced")}
    assert store.succeeded("req") is None and store.succeeded("junk") is None and store.succeeded("cut") is None
    assert {reason: untrusted(reason) - count for reason, count in before.items()} == {
        "unsigned": 2,
        "malformed": 1,
        "misplaced": 0,
    }

    store.mark_succeeded("done", {"type": "succeeded", "request_id": "done"})
    assert store.succeeded("done") == {"type": "succeeded", "request_id": "done"}
    put(store, store.path("req", SUCCEEDED), store.fs.cat_file(store.path("done", SUCCEEDED)))  # a genuine one, copied
    assert store.succeeded("req") is None and untrusted("misplaced") == before["misplaced"] + 1
    store.mark_succeeded("odd", {"type": "succeeded", "request_id": "another"})  # signed, but of another request inside
    assert store.succeeded("odd") is None


def test_what_a_store_lists_is_bounded(
    store: CheckpointStore, fleet: StoreSigning, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    honest(store, tmp_path, "req", 5)
    before = untrusted("too_large")
    put(
        store, store.path("req", "checkpoint-10", MANIFEST), b" " * (store_documents.MAX_DOCUMENT_BYTES + 10)
    )  # a manifest too big to read
    plant(store, "req", 11, {f"f{n}": b"x" for n in range(5)}, signing=fleet)  # more files than the bound below
    small = CheckpointStore(
        store.url,
        {"s3": {"client_kwargs": {"endpoint_url": store.fs.client_kwargs["endpoint_url"]}}}
        if store.url.startswith("s3://")
        else {},
        signing=fleet,
        max_bytes=1500,
    )
    monkeypatch.setattr(store_documents, "MAX_FILES", 4)
    assert [manifest.step for manifest in store.complete("req")] == [5]
    assert untrusted("too_large") == before + 2
    assert small.complete("req") == []  # checkpoint-5 lists 2003 bytes, over max_bytes
    assert untrusted("too_large") == before + 5  # and again the two above


def test_a_file_longer_than_its_manifest_says_is_read_no_further_than_one_byte_past_it(tmp_path: Path) -> None:
    source = io.BytesIO(b"x" * (10 * 2**20))
    assert bounded_copy(source, write_new(tmp_path / "target"), 10)[0] == 11
    assert source.tell() == 11 and (tmp_path / "target").stat().st_size == 11


def test_a_link_in_a_shared_folder_store_is_never_followed(fleet: StoreSigning, tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "shared"), {}, signing=fleet)
    honest(store, tmp_path, "req", 5)
    secret = tmp_path / "secret"
    secret.write_bytes(b"the host's secret")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "optimizer.pt").write_bytes(b"o" * 10)
    plant(store, "req", 8, {"adapter_model.safetensors": b"w"}, signing=fleet)
    root = tmp_path / "shared" / "req"
    (root / "checkpoint-8" / "adapter_model.safetensors").unlink()
    (root / "checkpoint-8" / "adapter_model.safetensors").symlink_to(secret)  # a link to a file...
    plant(
        store,
        "req",
        9,
        {"trainer_state.json": b"{}"},
        signing=fleet,
        manifest={
            "step": 9,
            "files": {
                "nested/optimizer.pt": {"size": 10, "sha256": __import__("hashlib").sha256(b"o" * 10).hexdigest()}
            },
        },
    )
    (root / "checkpoint-9" / "nested").symlink_to(tmp_path / "outside")  # ...and a link to a folder
    before = untrusted("link")
    assert [manifest.step for manifest in store.complete("req")] == [5]
    assert untrusted("link") == before + 2
    # A request's whole folder as a link: nothing of it is read, and removing it removes the link alone.
    os.symlink(root, tmp_path / "shared" / "linked")
    assert store.complete("linked") == [] and untrusted("link") == before + 3
    assert store.remove_checkpoints("linked") == 0 and not (tmp_path / "shared" / "linked").exists()
    os.symlink(root, tmp_path / "shared" / "linked")
    store.remove("linked")
    (root / "checkpoint-7").symlink_to(tmp_path / "outside")  # a checkpoint folder that is a link: removed as a link
    assert store.remove_checkpoints("req") == 4
    assert (
        not (tmp_path / "shared" / "linked").exists()
        and (tmp_path / "outside" / "optimizer.pt").exists()
        and secret.exists()
    )


def test_a_download_never_writes_through_a_link_on_the_host(store: CheckpointStore, tmp_path: Path) -> None:
    honest(store, tmp_path, "req", 5)
    outside = tmp_path / "outside"
    outside.mkdir()
    checkpoints = tmp_path / "host" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "checkpoint-5.partial").symlink_to(outside)  # left where the download writes
    [manifest] = store.complete("req")
    resumed = download(store, "req", manifest, checkpoints)
    assert list(outside.iterdir()) == [] and not resumed.is_symlink()
    assert (resumed / "nested" / "optimizer.pt").read_bytes() == b"o" * 500


def test_an_upload_leaves_out_links_in_the_saved_checkpoint(store: CheckpointStore, tmp_path: Path) -> None:
    saved = make_checkpoint(tmp_path / "saved", 3)
    (tmp_path / "key.pem").write_text("the fleet's private key")
    (saved / "key.pem").symlink_to(tmp_path / "key.pem")
    [manifest] = [store.upload("req", saved, 3)]
    assert "key.pem" not in manifest.files and not store.fs.exists(store.path("req", "checkpoint-3", "key.pem"))


def test_a_store_without_a_signing_key_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="checkpoint_store needs event_signing_key_file"):
        Settings(checkpoint_store=str(tmp_path / "store"))
