"""The child beats through `load_model` from a thread (issue 37: every stage is under the daemon's
stall watchdog): beats while the stage runs, and none once it has moved on to a stage with steps."""

from __future__ import annotations

import json
import os

import pytest

from handlers.toolkit import reporting
from handlers.toolkit.reporting import StatusReporter


def test_the_child_beats_while_it_loads_the_model_and_stops_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reporting, "HEARTBEAT_S", 0.01)
    read, write = os.pipe()
    reporter = StatusReporter(write)
    lines = os.fdopen(read, "r")
    reporter.enter("load_model")
    assert json.loads(lines.readline())["kind"] == "stage"
    assert json.loads(lines.readline()) == {"kind": "step", "step": 0}  # a beat, from the pulse thread
    pulse = reporter._pulse
    reporter.enter("train")
    assert pulse is not None
    pulse.join(timeout=5)
    assert not pulse.is_alive()
    reporter.close()
    kinds = [json.loads(line)["kind"] for line in lines.read().splitlines()]
    assert kinds[kinds.index("stage") :] == ["stage"]  # nothing after entering train: the pulse stopped
