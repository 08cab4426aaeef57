"""Regression tests through the daemon for the two holes of issue 12: a Hub dataset id shadowed by a
folder in the daemon's working directory, and a credential in a request's metadata; and the intake
refusals of sources outside the operator's policy. One daemon, all requests submitted together."""

import json
from pathlib import Path

import pytest

from daemon.settings import Settings
from schemas import Failed, Rejected, Succeeded
from testbed.client import read_records, submit, terminal_events
from testbed.data import CHAT_DATASET
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.conftest import S3_CREDENTIALS
from tests.helpers import sft_request

TOKEN = "hf_" + "Qx7" * 12  # a Hub token's shape, not a real one


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_hub_ids_never_read_local_folders_and_refusals_leak_nothing(
    published: HubServer, settings: Settings, tmp_path: Path
) -> None:
    # The daemon's working directory holds folders named like Hub datasets: one shadows a published
    # dataset with rows SFT cannot use, one exists only here (its rows would train).
    cwd = tmp_path / "daemon-cwd"
    (cwd / CHAT_DATASET).mkdir(parents=True)
    (cwd / CHAT_DATASET / "train.jsonl").write_text(json.dumps({"local_only": "LOCAL-ROWS"}) + "\n")
    (cwd / "tiny" / "local-only").mkdir(parents=True)
    (cwd / "tiny" / "local-only" / "train.jsonl").write_text(
        "".join(json.dumps({"text": f"local row {i}"}) + "\n" for i in range(6))
    )
    settings = settings.model_copy(
        update={"allowed_dataset_urls": ["s3://ml-data/curated/*"], "allowed_local_dataset_roots": [tmp_path / "data"]}
    )

    requests = {
        "shadowed": sft_request("shadowed"),
        "local-only-id": sft_request("local-only-id", dataset={"id": "tiny/local-only"}),
        "token-in-metadata": sft_request("token-in-metadata", metadata={"team": "tests", "hf_token": TOKEN}),
        "disallowed-prefix": sft_request("disallowed-prefix", dataset={"url": "s3://ml-data/raw/chat.parquet"}),
        "outside-roots": sft_request("outside-roots", dataset={"url": "/etc/adapterd/*.jsonl"}),
        "absolute-data-files": sft_request(
            "absolute-data-files", dataset={"id": CHAT_DATASET, "data_files": str(cwd / CHAT_DATASET / "train.jsonl")}
        ),
    }
    daemon = DaemonProcess(settings, tmp_path / "daemon.log", extra_env=S3_CREDENTIALS, cwd=cwd).start()
    try:
        for request in requests.values():
            await submit(settings, request)
        events = await terminal_events(settings, set(requests), timeout_s=600)
    finally:
        daemon.stop()

    shadowed = events["shadowed"][-1]
    assert isinstance(shadowed, Succeeded), shadowed
    [source] = shadowed.dataset_sources
    assert source.kind == "hub" and source.location == CHAT_DATASET
    assert source.revision == published.repo(CHAT_DATASET, repo_type="dataset").branches["main"]
    assert [f.path for f in source.files] == ["data/train.jsonl"]

    local_only = events["local-only-id"][-1]
    assert isinstance(local_only, Failed) and local_only.code == "dataset_unavailable", local_only

    refusals = {rid: events[rid][-1] for rid in requests if rid not in ("shadowed", "local-only-id")}
    assert all(isinstance(event, Rejected) for event in refusals.values()), refusals
    reasons = {rid: (e.reason, [x.path for x in e.errors]) for rid, e in refusals.items() if isinstance(e, Rejected)}
    assert reasons == {
        "token-in-metadata": ("secret_in_request", ["metadata.hf_token"]),
        "disallowed-prefix": ("policy", ["dataset.url"]),
        "outside-roots": ("policy", ["dataset.url"]),
        "absolute-data-files": ("invalid", ["dataset.data_files"]),
    }

    # The token is in no event, no DLQ header and no log line; the DLQ keeps the producer's own bytes.
    all_events = await read_records(settings, settings.events_topic, sum(len(e) for e in events.values()))
    assert not any(TOKEN.encode() in (record.value or b"") for record in all_events)
    dead = await read_records(settings, settings.dlq_topic, len(refusals))
    by_key = {record.key.decode(): record for record in dead if record.key}
    assert TOKEN.encode() in (by_key["token-in-metadata"].value or b"")
    assert not any(TOKEN.encode() in value for record in dead for _, value in record.headers)
    assert TOKEN not in daemon.log_path.read_text()
    assert not any(TOKEN in path.read_text(errors="replace") for path in settings.work_dir.rglob("*.log"))
