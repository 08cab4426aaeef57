"""Issue 42 through a running daemon: a short, low-entropy value under a key whose name says it is
a credential (`HF_TOKEN`, `hfToken`, `db-password`, `x-api-key`..., in `metadata` and in a TRL
block's free-form mapping) is rejected naming the key, and the value reaches no event, no DLQ
header and no log line; a request whose metadata names only contain a keyword (`tokenizer_name`,
`max_tokens`) is accepted and trains, its metadata echoed."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.settings import Settings
from schemas import Accepted, Rejected, Succeeded
from testbed.client import read_records, submit, terminal_events
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import sft_request

VALUE = "hf_SECRETSECRETSECRET"  # the value: no issuer's shape, too short and plain for the entropy rule

# request id → (the request's overrides, the path its rejection names)
REFUSED = {
    "key-HF_TOKEN": ({"metadata": {"team": "tests", "HF_TOKEN": VALUE}}, "metadata.HF_TOKEN"),
    "key-hfToken": ({"metadata": {"hfToken": VALUE}}, "metadata.hfToken"),
    "key-db-password": ({"metadata": {"db-password": VALUE}}, "metadata.db-password"),
    "key-x-api-key": ({"metadata": {"x-api-key": VALUE}}, "metadata.x-api-key"),
    "key-Authorization": ({"metadata": {"Authorization": VALUE}}, "metadata.Authorization"),
    "key-in-kwargs": ({"training": {"max_steps": 4, "lr_scheduler_kwargs": {"api_key": VALUE}}}, "training.lr_scheduler_kwargs.api_key"),
}
HARMLESS_METADATA = {"team": "tests", "tokenizer_name": "tiny/qwen2-chat", "max_tokens": "64"}


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_credential_named_keys_are_refused_naming_the_key_and_leak_nowhere(published: HubServer, settings: Settings, tmp_path: Path) -> None:
    requests = {rid: sft_request(rid, **overrides) for rid, (overrides, _) in REFUSED.items()}
    requests["harmless-names"] = sft_request("harmless-names", metadata=HARMLESS_METADATA)
    daemon = DaemonProcess(settings, tmp_path / "daemon.log").start()
    try:
        for request in requests.values():
            await submit(settings, request)
        events = await terminal_events(settings, set(requests), timeout_s=500)
    finally:
        daemon.stop()

    for rid, (_, path) in REFUSED.items():
        [rejected] = events[rid]
        assert isinstance(rejected, Rejected) and rejected.reason == "secret_in_request", (rid, rejected)
        assert [error.path for error in rejected.errors] == [path], (rid, rejected.errors)

    harmless = events["harmless-names"]
    assert isinstance(harmless[0], Accepted) and isinstance(harmless[-1], Succeeded), harmless
    assert all(event.metadata == HARMLESS_METADATA for event in harmless)

    # The value is in no event, no DLQ header and no log line; the DLQ keeps the producer's own bytes.
    all_events = await read_records(settings, settings.events_topic, sum(len(e) for e in events.values()))
    assert not any(VALUE.encode() in (record.value or b"") for record in all_events)
    dead = await read_records(settings, settings.dlq_topic, len(REFUSED))
    assert sorted(record.key.decode() for record in dead if record.key) == sorted(REFUSED)
    assert all(VALUE.encode() in (record.value or b"") for record in dead)
    assert not any(VALUE.encode() in value for record in dead for _, value in record.headers)
    assert any(name == "adapterd-reason" and value == b"secret_in_request" for record in dead for name, value in record.headers)
    assert "request.rejected" in daemon.log_path.read_text()  # the log was written, and holds the rejections...
    assert VALUE not in daemon.log_path.read_text()  # ...but not the value
    assert not any(VALUE in path.read_text(errors="replace") for path in settings.work_dir.rglob("*.log"))
