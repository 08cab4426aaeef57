"""Issue 42 through a running daemon: a short, low-entropy value under a key whose name says it is
a credential (`HF_TOKEN`, `hfToken`, `db-password`, `x-api-key`..., in `metadata` and in a TRL
block's free-form mapping) is rejected naming the key, and the value reaches no event, no DLQ
header and no log line; a request whose metadata names only contain a keyword (`tokenizer_name`,
`max_tokens`) is accepted and trains, its metadata echoed.

Issue 46: a credential name in Unicode lookalikes (fullwidth, Cyrillic `а`, a zero-width space),
written raw in UTF-8 as a producer's JSON may be, and the words `session`, `access_key`, `jwt`,
`dsn`, `connection_string`, `pass` are refused the same; a tokenizer's token names (`eot_token`,
`fim_prefix_token`, `max_token`...) are not, and the request after the refused ones on the same
partition (the topic has one) still trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.settings import Settings
from schemas import Accepted, Rejected, Succeeded
from testbed.client import produce, read_records, submit, terminal_events
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
    "key-in-kwargs": (
        {"training": {"max_steps": 4, "lr_scheduler_kwargs": {"api_key": VALUE}}},
        "training.lr_scheduler_kwargs.api_key",
    ),
    "key-fullwidth": (
        {"metadata": {"\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44": VALUE}},
        "metadata.\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44",
    ),
    "key-cyrillic": ({"metadata": {"p\u0430ssword": VALUE}}, "metadata.p\u0430ssword"),
    "key-zero-width": (
        {"training": {"max_steps": 4, "lr_scheduler_kwargs": {"to\u200bken": VALUE}}},
        "training.lr_scheduler_kwargs.to\u200bken",
    ),
    "key-session": ({"metadata": {"session": VALUE}}, "metadata.session"),
    "key-access_key": ({"metadata": {"access_key": VALUE}}, "metadata.access_key"),
    "key-jwt": ({"metadata": {"jwt": VALUE}}, "metadata.jwt"),
    "key-dsn": ({"metadata": {"sentry_dsn": VALUE}}, "metadata.sentry_dsn"),
    "key-connection_string": ({"metadata": {"connection_string": VALUE}}, "metadata.connection_string"),
    "key-pass": ({"metadata": {"db_pass": VALUE}}, "metadata.db_pass"),
}
HARMLESS_METADATA = {
    "team": "tests",
    "tokenizer_name": "tiny/qwen2-chat",
    "max_tokens": "64",
    "eot_token": "<|eot_id|>",
    "boi_token": "<start_of_image>",
    "eom_token": "<|eom_id|>",
    "fim_prefix_token": "<|fim_prefix|>",
    "assistant_token": "<|assistant|>",
    "chat_template_token": "<|im_start|>",
    "max_token": "64",
    "pass_threshold": "0.5",
    "compass": "north",
}


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_credential_named_keys_are_refused_naming_the_key_and_leak_nowhere(
    published: HubServer, settings: Settings, tmp_path: Path
) -> None:
    requests = {rid: sft_request(rid, **overrides) for rid, (overrides, _) in REFUSED.items()}
    requests["harmless-names"] = sft_request("harmless-names", metadata=HARMLESS_METADATA)
    daemon = DaemonProcess(settings, tmp_path / "daemon.log").start()
    try:
        for request in requests.values():  # the harmless one last, behind the refused ones
            if request["request_id"] in REFUSED:  # raw UTF-8, unescaped, as a producer may write it
                await produce(
                    settings, json.dumps(request, ensure_ascii=False).encode(), request["request_id"].encode()
                )
            else:
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
    assert any(
        name == "adapterd-reason" and value == b"secret_in_request" for record in dead for name, value in record.headers
    )
    assert "request.rejected" in daemon.log_path.read_text()  # the log was written, and holds the rejections...
    assert VALUE not in daemon.log_path.read_text()  # ...but not the value
    assert not any(VALUE in path.read_text(errors="replace") for path in settings.work_dir.rglob("*.log"))
