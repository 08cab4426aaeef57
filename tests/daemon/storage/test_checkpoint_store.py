"""The checkpoint store against real object stores on the loopback (moto's S3 server, the GCS emulator,
Azurite) and a shared folder: an upload is whole only with its manifest, a partial or corrupt one is
skipped for the one before it, a host resumes from the store's newest when it is newer than its own,
a store that is down leaves the job's checkpoints local (and says so), and a succeeded job's go."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from daemon.job.events import JobEvents
from daemon.job.uploads import CheckpointUploads, fetch
from daemon.kafka.publisher import Publisher
from daemon.settings import Settings
from daemon.store.checkpoints import MANIFEST, CheckpointStore, StoreError
from daemon.store.documents import StoreSigning
from daemon.store.download import download
from daemon.store.host_checkpoints import local_checkpoints
from daemon.store.journal import Journal
from daemon.store.opening import store_signing
from daemon.store.pruning import RECENT_S, prune_store
from schemas.events import Checkpoint, EventBase
from schemas.request import SFTRequest
from tests.conftest import S3_CREDENTIALS, free_port
from tests.helpers import fleet_key, sft_request

BUCKET = "checkpoints"


def make_checkpoint(folder: Path, step: int, size: int = 1000) -> Path:
    """A folder shaped like the trainer's: weights, optimizer state, its trainer_state.json."""
    path = folder / f"checkpoint-{step}"
    (path / "nested").mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(bytes([step % 256]) * size)
    (path / "nested" / "optimizer.pt").write_bytes(b"o" * (size // 2))
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


@pytest.fixture
def signing(tmp_path: Path) -> StoreSigning:
    """The fleet's key, as a host with a store has it (its event_signing_key_file)."""
    made = store_signing(Settings(event_signing_key_file=fleet_key(tmp_path / "keys")))
    assert made is not None
    return made


@pytest.fixture
def s3_store(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, signing: StoreSigning) -> Iterator[CheckpointStore]:
    import boto3

    for name, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    if BUCKET not in [bucket["Name"] for bucket in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=BUCKET)
    options = {"s3": {"client_kwargs": {"endpoint_url": s3_endpoint}}}
    yield CheckpointStore(f"s3://{BUCKET}/run-{uuid.uuid4().hex[:8]}", options, host="host-a", signing=signing)


@pytest.fixture(params=["s3", "gcs", "azure", "folder"])
def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signing: StoreSigning
) -> CheckpointStore:
    prefix = f"run-{uuid.uuid4().hex[:8]}"
    if request.param == "s3":
        return cast(CheckpointStore, request.getfixturevalue("s3_store"))
    if request.param == "gcs":
        endpoint = request.getfixturevalue("gcs_endpoint")
        return CheckpointStore(
            f"gs://ml-data/{prefix}",
            {"gs": {"endpoint_url": endpoint, "token": "anon"}},
            host="host-a",
            signing=signing,
        )
    if request.param == "azure":
        from azure.storage.blob import BlobServiceClient

        connection = request.getfixturevalue("azurite")
        service = BlobServiceClient.from_connection_string(connection)
        if "checkpoints" not in [container.name for container in service.list_containers()]:
            service.create_container("checkpoints")
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)
        return CheckpointStore(f"az://checkpoints/{prefix}", {}, host="host-a", signing=signing)
    return CheckpointStore(str(tmp_path / "shared" / prefix), {}, host="host-a", signing=signing)


def test_an_upload_is_whole_with_its_manifest_and_comes_back_byte_for_byte(
    store: CheckpointStore, tmp_path: Path
) -> None:
    saved = make_checkpoint(tmp_path / "host-a", 10)
    store.upload("req-1", saved, 10)
    [manifest] = store.complete("req-1")
    assert manifest.step == 10 and set(manifest.files) == {
        "adapter_model.safetensors",
        "nested/optimizer.pt",
        "trainer_state.json",
    }
    assert manifest.url.endswith("/req-1/checkpoint-10")

    resumed = download(store, "req-1", manifest, tmp_path / "host-b" / "checkpoints")
    for file in saved.rglob("*"):
        if file.is_file():
            assert (resumed / file.relative_to(saved)).read_bytes() == file.read_bytes()
    assert store.requests() == ["req-1"]
    assert store.succeeded("req-1") is None
    store.mark_succeeded("req-1", {"type": "succeeded", "request_id": "req-1"})  # signed, for this request
    assert store.remove_checkpoints("req-1") == 1
    assert store.complete("req-1") == [] and store.succeeded("req-1") == {"type": "succeeded", "request_id": "req-1"}
    store.remove("req-1")
    assert store.succeeded("req-1") is None and store.requests() == []


def test_a_partial_upload_is_skipped_for_the_one_before_it(s3_store: CheckpointStore, tmp_path: Path) -> None:
    store = s3_store
    store.upload("req-2", make_checkpoint(tmp_path, 5), 5)
    # An upload cut short (the host lost mid-upload): its files, no manifest.
    newer = make_checkpoint(tmp_path, 10)
    store.fs.put_file(
        str(newer / "adapter_model.safetensors"), f"{store.root}/req-2/checkpoint-10/adapter_model.safetensors"
    )
    # One whose manifest lists a file that never arrived whole.
    store.upload("req-2", make_checkpoint(tmp_path, 15), 15)
    store.fs.pipe_file(f"{store.root}/req-2/checkpoint-15/nested/optimizer.pt", b"cut")
    assert [manifest.step for manifest in store.complete("req-2")] == [5]

    checkpoints = tmp_path / "host-b"
    assert fetch(store, "req-2", checkpoints) == (5, "store")
    assert list(local_checkpoints(checkpoints)) == [5]


def test_a_corrupt_checkpoint_is_skipped_for_the_one_before_it(s3_store: CheckpointStore, tmp_path: Path) -> None:
    store = s3_store
    store.upload("req-3", make_checkpoint(tmp_path, 5), 5)
    store.upload("req-3", make_checkpoint(tmp_path, 10), 10)
    # Same size, other bytes: its listing looks whole, its hash does not match.
    store.fs.pipe_file(f"{store.root}/req-3/checkpoint-10/adapter_model.safetensors", b"x" * 1000)
    [newest, _] = store.complete("req-3")
    with pytest.raises(StoreError, match="does not match its manifest"):
        download(store, "req-3", newest, tmp_path / "probe")
    assert (
        not (tmp_path / "probe" / "checkpoint-10").exists()
        and not (tmp_path / "probe" / "checkpoint-10.partial").exists()
    )

    checkpoints = tmp_path / "host-b"
    assert fetch(store, "req-3", checkpoints) == (5, "store")
    assert (checkpoints / "checkpoint-5" / "adapter_model.safetensors").read_bytes() == bytes([5]) * 1000


def test_the_store_is_used_only_when_newer_than_the_hosts_own(s3_store: CheckpointStore, tmp_path: Path) -> None:
    s3_store.upload("req-4", make_checkpoint(tmp_path / "a", 10), 10)
    checkpoints = tmp_path / "b"
    make_checkpoint(checkpoints, 12)
    assert fetch(s3_store, "req-4", checkpoints) == (12, "local")
    assert list(local_checkpoints(checkpoints)) == [12]  # nothing downloaded
    assert fetch(s3_store, "req-none", tmp_path / "c") is None


class Recorded:
    """A publisher that keeps what it is given (JobEvents calls only `publish`)."""

    def __init__(self) -> None:
        self.events: list[EventBase] = []

    async def publish(self, event: EventBase, trace: Any = None) -> None:
        self.events.append(event)


def uploads_for(
    store: CheckpointStore | None, job_dir: Path, request_id: str, keep: int = 2
) -> tuple[CheckpointUploads, Recorded]:
    recorded = Recorded()
    events = JobEvents(cast(Publisher, recorded), SFTRequest.model_validate(sft_request(request_id)), "host-a", 1, [])
    return CheckpointUploads(store, request_id, job_dir, Journal(job_dir / "journal.json"), events, keep), recorded


async def test_each_checkpoint_is_uploaded_the_journal_says_the_last_and_older_ones_go(
    s3_store: CheckpointStore, tmp_path: Path
) -> None:
    job_dir = tmp_path / "jobs" / "req-5"
    uploads, recorded = uploads_for(s3_store, job_dir, "req-5", keep=2)
    for step in (5, 10, 15):
        saved = make_checkpoint(job_dir / "checkpoints", step)
        await uploads.saved(step, str(saved))
        await uploads.finish(None)
    checkpoints = [event for event in recorded.events if isinstance(event, Checkpoint)]
    assert [(event.step, event.location) for event in checkpoints] == [(5, "store"), (10, "store"), (15, "store")]
    assert checkpoints[-1].store_url == f"{s3_store.url}/req-5/checkpoint-15"
    assert Journal(job_dir / "journal.json").read()["stored_checkpoint"]["step"] == 15
    assert [manifest.step for manifest in s3_store.complete("req-5")] == [15, 10]  # checkpoint_store_keep 2
    assert not (job_dir / "uploading").exists() or not any((job_dir / "uploading").iterdir())

    await uploads.abandon()  # the job succeeded
    assert s3_store.complete("req-5") == []


async def test_a_checkpoint_saved_while_one_uploads_waits_and_an_older_waiting_one_is_passed_over(
    s3_store: CheckpointStore,
    tmp_path: Path,
) -> None:
    job_dir = tmp_path / "jobs" / "req-6"
    uploads, recorded = uploads_for(s3_store, job_dir, "req-6")
    for step in (1, 2, 3):  # three saves before the first upload has had a turn
        await uploads.saved(step, str(make_checkpoint(job_dir / "checkpoints", step)))
    await uploads.finish(None)
    said = {event.step: event for event in recorded.events if isinstance(event, Checkpoint)}
    assert said[1].location == "store" and said[3].location == "store"
    assert said[2].location == "local" and "passed over for checkpoint 3" in (said[2].store_error or "")


async def test_a_store_that_is_down_leaves_the_checkpoint_local_and_says_why(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    signing: StoreSigning,
) -> None:
    for name, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    down = CheckpointStore(
        f"s3://{BUCKET}/down",
        {
            "s3": {
                "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}"},
                "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}},
            }
        },
        signing=signing,
    )
    job_dir = tmp_path / "jobs" / "req-7"
    uploads, recorded = uploads_for(down, job_dir, "req-7")
    saved = make_checkpoint(job_dir / "checkpoints", 4)
    await uploads.saved(4, str(saved))
    await uploads.finish(None)
    [event] = recorded.events
    assert isinstance(event, Checkpoint) and event.location == "local" and event.store_url is None
    assert event.store_error is not None and "upload of checkpoint-4 of req-7" in event.store_error
    assert "stored_checkpoint" not in Journal(job_dir / "journal.json").read()
    assert saved.is_dir()  # the job's own checkpoint is untouched: it resumes from it here
    assert fetch(down, "req-7", job_dir / "checkpoints") == (4, "local")


async def test_without_a_store_the_event_says_local(tmp_path: Path) -> None:
    uploads, recorded = uploads_for(None, tmp_path / "job", "req-8")
    await uploads.saved(3, str(tmp_path / "job" / "checkpoints" / "checkpoint-3"))
    [event] = recorded.events
    assert isinstance(event, Checkpoint) and event.location == "local" and event.store_error is None


def test_a_store_url_is_checked_where_it_is_set(tmp_path: Path) -> None:
    key = fleet_key(tmp_path)
    assert (
        Settings(checkpoint_store="s3://bucket/prefix/", event_signing_key_file=key).checkpoint_store
        == "s3://bucket/prefix"
    )
    assert Settings(checkpoint_store=str(tmp_path), event_signing_key_file=key).checkpoint_store == str(tmp_path)
    for bad in ("ftp://host/x", "s3://", "relative/folder"):
        with pytest.raises(ValueError, match="checkpoint_store"):
            Settings(checkpoint_store=bad, event_signing_key_file=key)


def test_retention_in_the_store_removes_succeeded_aged_and_counted_never_a_running_one(
    s3_store: CheckpointStore, tmp_path: Path
) -> None:
    store, jobs_dir = s3_store, tmp_path / "jobs"
    for request_id in ("done", "running", "old", "partial", "young"):
        store.upload(request_id, make_checkpoint(tmp_path / request_id, 5), 5)
    Journal(jobs_dir / "done" / "journal.json").record("succeeded", {"type": "succeeded"})
    Journal(jobs_dir / "running" / "journal.json").record(
        "succeeded", {"type": "succeeded"}
    )  # still in use here: left alone
    store.fs.rm(f"{store.root}/partial/checkpoint-5/{MANIFEST}")  # no whole checkpoint: its files' age counts
    now = time.time()

    pruned = prune_store(store, jobs_dir, {"running"}, max_age_s=3600, max_count=10, now=now)
    assert pruned.succeeded == ["done"] and pruned.aged == [] and pruned.counted == []
    assert set(store.requests()) == {"running", "old", "partial", "young"}

    # A day on: everything is older than max_age_s but the job running here.
    later = prune_store(store, jobs_dir, {"running"}, max_age_s=3600, max_count=10, now=now + 86400)
    assert sorted(later.aged) == ["old", "partial", "young"]
    assert store.requests() == ["running"]


def test_retention_by_count_takes_the_least_recently_written_and_never_a_recent_one(
    s3_store: CheckpointStore, tmp_path: Path
) -> None:
    store = s3_store
    for request_id in ("first", "second", "third"):
        store.upload(request_id, make_checkpoint(tmp_path / request_id, 5), 5)
    now = time.time()
    assert (
        prune_store(store, tmp_path / "jobs", (), max_age_s=10 * 86400, max_count=1, now=now).counted == []
    )  # all written just now
    pruned = prune_store(store, tmp_path / "jobs", (), max_age_s=10 * 86400, max_count=1, now=now + RECENT_S + 60)
    assert sorted(pruned.counted) == ["first", "second"] and store.requests() == ["third"]
