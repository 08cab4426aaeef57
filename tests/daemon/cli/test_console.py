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
