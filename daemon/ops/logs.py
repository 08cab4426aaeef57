"""Logging set-up: one formatter for structlog and the standard library's loggers (aiokafka's).

JSON lines in production (systemd's journal: stderr is not a terminal, or `log_format = "json"`),
readable lines on a terminal. Every line carries `event`, `level` and `timestamp`; the standard
library's lines also carry `logger` (aiokafka's module). Log calls use constant event names plus
key-value pairs: `log.info("job.started", request_id=...)`.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog
from aiokafka.errors import CoordinatorNotAvailableError

# Other libraries' loggers are this quiet at least: aiokafka's info lines are one per connection.
FOREIGN_LEVEL = logging.WARNING


class CoordinatorElection(logging.Filter):
    """aiokafka logs ERROR when the group coordinator is not available yet, which is what a broker
    that has just started answers while it elects one; aiokafka retries it. That one condition is
    lowered to INFO (and shown only where INFO is); every other aiokafka error stays an error.

    Its WARNING "Marking the coordinator dead" is lowered too: on a broker that has just created
    `__consumer_offsets` (the demo's, 3 runs in 5), the first JoinGroup is answered "not the
    coordinator" while the group's partition loads, and aiokafka warns, finds it again and joins.
    A coordinator that is really lost (a broker down, heartbeats failing) is said by aiokafka's
    own ERROR line before it, which stays."""

    def __init__(self, threshold: int) -> None:
        super().__init__()
        self.threshold = threshold

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.name == "aiokafka.consumer.group_coordinator"
            and record.levelno == logging.ERROR
            and isinstance(record.args, tuple)
            and any(isinstance(arg, CoordinatorNotAvailableError) for arg in record.args)
        ):
            record.levelno, record.levelname = logging.INFO, "INFO"
            return self.threshold <= logging.INFO
        if record.name == "aiokafka.consumer.group_coordinator" and str(record.msg).startswith(
            "Marking the coordinator dead"
        ):
            record.levelno, record.levelname = logging.INFO, "INFO"
            return self.threshold <= logging.INFO
        return True


def configure_logging(log_format: Literal["auto", "json", "console"] = "auto", level: str = "info") -> None:
    use_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(
            colors=sys.stderr.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
    )
    stamp: list[structlog.types.Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *stamp],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *([structlog.processors.format_exc_info] if use_json else []),
            renderer,
        ],
    )
    threshold = max(FOREIGN_LEVEL, logging.getLevelNamesMapping()[level.upper()])
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    handler.addFilter(CoordinatorElection(threshold))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(threshold)

    # structlog's events go through one standard-library logger of their own, at the daemon's level.
    own = logging.getLogger("adapterd")
    own.setLevel(level.upper())
    structlog.configure(
        processors=[*stamp, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=lambda *args: own,
        cache_logger_on_first_use=True,
    )
