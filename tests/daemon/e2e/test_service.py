"""End to end: `adapterd run` against the real broker, real TRL in a child process, the local Hub.

The cases run on the session's shared daemon (tests/conftest.py `shared_daemon`), so each reads back
only its own records: its events by request id, its dead letters by key, the committed offset
from the offsets its own records were given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.settings import Settings
from schemas import Accepted, Failed, Progress, Rejected, Started, Succeeded
from testbed.client import produce, records_of, submit, terminal_events, wait_for_commit
from testbed.data import TINY_MODEL
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import assert_adapter_trained, download, sft_request

pytestmark = pytest.mark.slow


async def test_sft_request_trains_pushes_and_commits(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings, tmp_path: Path
) -> None:
    settings = shared_settings
    offset = await submit(settings, sft_request("sft-e2e-1"))
    events = (await terminal_events(settings, {"sft-e2e-1"}))["sft-e2e-1"]

    kinds = [event.type for event in events]
    assert kinds[0] == "accepted" and kinds[1] == "started" and kinds[-1] == "succeeded", kinds
    assert isinstance(events[0], Accepted) and isinstance(events[1], Started)
    progress = [event for event in events if isinstance(event, Progress)]
    assert [p.step for p in progress][-1] == 4 and all(p.total_steps == 4 for p in progress)
    assert all(event.metadata == {"team": "tests"} for event in events)

    done = events[-1]
    assert isinstance(done, Succeeded)
    commits = published.commits("results/sft-e2e-1")
    assert len(commits) == 1 and done.commit_sha == commits[0].sha
    assert "adapterd-request-id: sft-e2e-1" in commits[0].description
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "README.md"} <= set(commits[0].files)
    assert done.base_model_revision == published.commits(TINY_MODEL)[0].sha
    assert done.trainer == "trl.SFTTrainer/trl.SFTConfig"
    assert set(done.versions) >= {"adapterd", "trl", "transformers", "peft", "torch"}
    assert {"queue", "load_model", "train", "push", "total"} <= set(done.durations_s)
    assert done.metrics["train_loss"] > 0 and done.dataset_fingerprint

    # The pushed adapter, downloaded by its commit, loads with PEFT on the base model from the Hub,
    # and training moved its weights (LoRA B starts at zero).
    adapter = download(published.endpoint, "results/sft-e2e-1", done.commit_sha, tmp_path / "hf")
    assert_adapter_trained(adapter, download(published.endpoint, TINY_MODEL, None, tmp_path / "hf"))

    await wait_for_commit(settings, offset + 1)


async def test_bad_input_is_rejected_and_the_daemon_keeps_serving(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings, tmp_path: Path
) -> None:
    misspelled = sft_request("bad-fields")
    misspelled["training"] = {"learning_rat": 0.1, "max_steps": -1}
    outside_policy = sft_request("bad-policy", model={"id": "/etc/models/base"})
    settings = shared_settings
    await produce(settings, b"\x00 this is not json", b"bad-json")
    await produce(settings, b"[1, 2, 3]", b"bad-array")
    await produce(settings, json.dumps({**sft_request("bad-method"), "method": "sft-turbo"}).encode(), b"bad-method")
    misspelled_at = await produce(settings, json.dumps(misspelled).encode(), b"bad-fields")
    await submit(settings, outside_policy)
    last = await submit(
        settings, sft_request("good-after-bad", dataset={"rows": [{"prompt": "2+2=", "completion": "4"}] * 4})
    )

    events = await terminal_events(
        settings, {"bad-json", "bad-array", "bad-method", "bad-fields", "bad-policy", "good-after-bad"}
    )
    rejected = {rid: evs[-1] for rid, evs in events.items() if rid != "good-after-bad"}
    assert all(
        isinstance(event, Rejected) and len(evs) == 1
        for event, evs in zip(rejected.values(), [events[r] for r in rejected], strict=True)
    )
    assert rejected["bad-json"].reason == "not_json"
    assert rejected["bad-array"].reason == "not_an_object"
    assert rejected["bad-method"].errors[0].path == "method" and "sft-turbo" in rejected["bad-method"].errors[0].message
    paths = {error.path for error in rejected["bad-fields"].errors}
    assert paths == {"training.learning_rat", "training.max_steps"}
    assert rejected["bad-policy"].reason == "policy" and rejected["bad-policy"].errors[0].path == "model.id"
    assert isinstance(events["good-after-bad"][-1], Succeeded)

    dead = await records_of(
        settings, settings.dlq_topic, [b"bad-json", b"bad-array", b"bad-method", b"bad-fields", b"bad-policy"]
    )
    assert [record.key for record in dead] == [b"bad-json", b"bad-array", b"bad-method", b"bad-fields", b"bad-policy"]
    assert dead[0].value == b"\x00 this is not json"
    headers = dict(dead[3].headers)
    assert headers["adapterd-reason"] == b"invalid"
    assert headers["adapterd-source-topic"] == settings.requests_topic.encode()
    assert headers["adapterd-source-offset"] == str(misspelled_at).encode()
    assert {e["path"] for e in json.loads(headers["adapterd-errors"])} == paths

    await wait_for_commit(settings, last + 1)
    assert shared_daemon.process is not None and shared_daemon.process.poll() is None


async def test_unloadable_model_or_dataset_fails_with_its_stage(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings
) -> None:
    settings = shared_settings
    await submit(settings, sft_request("no-such-model", model={"id": "tiny/does-not-exist"}))
    last = await submit(settings, sft_request("no-such-dataset", dataset={"id": "tiny/does-not-exist"}))
    events = await terminal_events(settings, {"no-such-model", "no-such-dataset"})

    model_failure = events["no-such-model"][-1]
    assert isinstance(model_failure, Failed)
    assert (model_failure.code, model_failure.stage) == ("model_unavailable", "load_model")
    assert "tiny/does-not-exist" in model_failure.message and model_failure.message.startswith("model.id:")

    dataset_failure = events["no-such-dataset"][-1]
    assert isinstance(dataset_failure, Failed)
    assert (dataset_failure.code, dataset_failure.stage) == ("dataset_unavailable", "load_dataset")
    assert "tiny/does-not-exist" in dataset_failure.message

    await wait_for_commit(settings, last + 1)
