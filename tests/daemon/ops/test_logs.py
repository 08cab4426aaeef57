"""Every line the daemon writes to stderr is one JSON object, its own and aiokafka's alike."""

import json
import subprocess
import sys

SCRIPT = """
import logging, sys
import structlog
from aiokafka.errors import CoordinatorNotAvailableError
from daemon.ops.logs import configure_logging

configure_logging(sys.argv[1], "info")
log = structlog.get_logger()
log.info("test.structlog", request_id="r-1", step=3)
log.debug("test.hidden")
logging.getLogger("aiokafka.conn").warning("Unable to connect to %s", "127.0.0.1:1")
logging.getLogger("aiokafka.conn").info("a chatty info line")
coordinator = logging.getLogger("aiokafka.consumer.group_coordinator")
coordinator.error("Group Coordinator Request failed: %s", CoordinatorNotAvailableError())
coordinator.error("Group Coordinator Request failed: %s", RuntimeError("a real one"))
coordinator.warning("Marking the coordinator dead (node %s)for group %s.", 1, "adapterd-demo")
try:
    1 / 0
except ZeroDivisionError:
    log.exception("test.failed")
"""


def run(log_format: str) -> str:
    result = subprocess.run([sys.executable, "-c", SCRIPT, log_format], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_structlog_and_standard_library_lines_are_json_lines() -> None:
    lines = [json.loads(line) for line in run("json").splitlines()]  # raises on any line that is not JSON
    for line in lines:
        assert {"event", "level", "timestamp"} <= line.keys(), line
    by_event = {line["event"]: line for line in lines}
    assert by_event["test.structlog"] | {"request_id": "r-1", "step": 3, "level": "info"} == by_event["test.structlog"]
    assert by_event["Unable to connect to 127.0.0.1:1"]["logger"] == "aiokafka.conn"
    assert by_event["Unable to connect to 127.0.0.1:1"]["level"] == "warning"
    assert "ZeroDivisionError" in by_event["test.failed"]["exception"]
    # aiokafka's info lines stay out; a coordinator still being elected is info, not an error; a real error stays one.
    assert "test.hidden" not in by_event and "a chatty info line" not in by_event
    failures = [line for line in lines if line["event"].startswith("Group Coordinator Request failed")]
    assert [(line["level"], line["event"]) for line in failures] == [
        ("error", "Group Coordinator Request failed: a real one")
    ]
    assert not [
        line for line in lines if line["event"].startswith("Marking the coordinator dead")
    ]  # a fresh broker's, retried


def test_console_lines_have_no_escape_codes_off_a_terminal() -> None:
    output = run("console")
    assert "\x1b" not in output
    assert "test.structlog" in output and "Unable to connect" in output and "[error" in output
    assert "CoordinatorNotAvailable" not in output and "Marking the coordinator dead" not in output
