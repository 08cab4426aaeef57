"""Following a request on the console (`submit --wait`, the demo) when the output is not a terminal:
each event on one line however long its path, and a progress label that reads as words (issue 49)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from daemon.cli.console import follow_to_end
from schemas import Event, parse_event
from tests.helpers import event_document

LONG = "/var/lib/adapterd/outputs/" + "a-rather-long-organisation-name/" * 4 + "tiny-sft-adapter"


class Stream:
    """An EventStream's `events()` over a fixed list."""

    def __init__(self, documents: list[dict[str, Any]]) -> None:
        self.events_ = [parse_event(json.dumps(document).encode()) for document in documents]

    async def events(self, request_id: str) -> AsyncIterator[Event]:
        for event in self.events_:
            yield event


async def test_event_lines_are_not_wrapped_and_the_label_says_training(capsys: pytest.CaptureFixture[str]) -> None:
    progress = event_document("progress", request_id="r-1", step=3, total_steps=10, loss=5.6963, stage="train")
    succeeded = event_document(
        "succeeded",
        request_id="r-1",
        sink="local",
        commit_sha=None,
        commit_url=None,
        location=LONG,
        evaluation=None,
        published="main",
        duplicate=False,
    )
    code = await follow_to_end(Stream([event_document("accepted", request_id="r-1"), progress, succeeded]), "r-1")  # type: ignore[arg-type]
    assert code == 0
    err = capsys.readouterr().err
    assert len(LONG) > 120 and any(
        line.endswith(f"succeeded on {succeeded['host']}: {LONG}") for line in err.splitlines()
    ), err
    assert "r-1: training, loss 5.6963" in err and "step, loss" not in err, err


async def test_an_online_methods_progress_shows_its_reward_beside_its_loss(capsys: pytest.CaptureFixture[str]) -> None:
    """GRPO's loss starts at 0 and says little: the bar shows the mean reward TRL logs beside it (the grpo-math demo
    ended on "loss 0.0000" alone); a method without rewards shows none."""
    grpo = event_document("progress", request_id="r-2", step=2, total_steps=4, loss=0.0, reward=0.75, stage="train")
    sft = event_document("progress", request_id="r-2", step=3, total_steps=4, loss=1.25, reward=None, stage="train")
    failed = event_document("failed", request_id="r-2")
    assert await follow_to_end(Stream([grpo, failed]), "r-2") == 1  # type: ignore[arg-type]
    assert "r-2: training, loss 0.0000, reward 0.7500" in capsys.readouterr().err
    await follow_to_end(Stream([sft, failed]), "r-2")  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert "r-2: training, loss 1.2500" in err and "reward" not in err, err
