"""End to end, a pipeline (issue 63): `adapterd run` against the real broker, real TRL in a child process, the local
Hub. An SFT request and a DPO request naming it in `after` and starting from its adapter are published at once; the
DPO job starts only once the SFT succeeded, trains the SFT's adapter (the pushed commit), and succeeds. A request
waiting for one that fails ends failed with the reason, nothing trained."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from daemon.cli.demo.requests import PREFERENCE_ROWS
from daemon.settings import Settings
from schemas import Failed, Started, Succeeded
from testbed.client import submit, terminal_events
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import SMALL_TRAINING, download, example_request, sft_request

pytestmark = pytest.mark.slow


async def test_a_dpo_waits_for_its_sft_and_trains_the_sft_adapter(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings, tmp_path: Path
) -> None:
    settings = shared_settings
    sft = sft_request("chain-sft")  # LoRA r 4
    dpo = example_request(
        "dpo",
        "chain-dpo",
        dataset={"rows": PREFERENCE_ROWS},
        training={**SMALL_TRAINING, "max_steps": 2},
        peft={"r": 8, "lora_alpha": 16},  # not applied: the SFT adapter's own configuration is trained on
        after=["chain-sft"],
        start_from="chain-sft",
    )
    orphan = sft_request("chain-orphan", after=["chain-broken"])
    broken = sft_request("chain-broken", model={"id": "tiny/does-not-exist"})
    # The dependants first, at once with what they wait for: published first, read first where they share a partition.
    await asyncio.gather(submit(settings, dpo), submit(settings, orphan))
    await asyncio.gather(submit(settings, sft), submit(settings, broken))
    events = await terminal_events(settings, {"chain-sft", "chain-dpo", "chain-orphan", "chain-broken"})

    sft_done, dpo_events = events["chain-sft"][-1], events["chain-dpo"]
    assert isinstance(sft_done, Succeeded) and sft_done.commit_sha is not None, sft_done
    assert isinstance(dpo_events[-1], Succeeded), dpo_events[-1]
    [started] = [event for event in dpo_events if isinstance(event, Started)]
    assert started.time >= sft_done.time  # it started only once the SFT had succeeded
    assert [event.type for event in dpo_events if event.type == "waiting"] in ([], ["waiting"])

    # It trained the SFT's adapter, at the SFT's commit: the child says so, and the pushed adapter has its LoRA rank.
    child_log = (settings.jobs_dir / "chain-dpo" / "child.log").read_text()
    assert (
        f"start_from chain-sft: results/chain-sft@{sft_done.commit_sha} (adapter, trainable and as the reference)"
        in (child_log)
    )
    pushed = download(published.endpoint, "results/chain-dpo", dpo_events[-1].commit_sha, tmp_path / "hf")
    assert json.loads((Path(pushed) / "adapter_config.json").read_text())["r"] == 4
    assert not (Path(pushed) / "ref").exists()
    card = (Path(pushed) / "README.md").read_text()  # the model card names the chain
    assert "- After: `chain-sft`" in card
    assert f"- Started from: `results/chain-sft` at `{sft_done.commit_sha}`, published by `chain-sft`" in card

    # The request waiting for one that failed ends failed, naming it and why, without training.
    assert isinstance(events["chain-broken"][-1], Failed)
    ended = events["chain-orphan"][-1]
    assert isinstance(ended, Failed) and (ended.code, ended.stage) == ("prerequisite_failed", "intake"), ended
    assert ended.message.startswith("after: chain-broken failed: model_unavailable")
    assert not any(event.type == "started" for event in events["chain-orphan"])
