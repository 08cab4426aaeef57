"""Every error adapterd raises on purpose, in one small hierarchy:

    AdapterdError                  (schemas.common)
    ├── ConfigError                the daemon's own settings are wrong
    │   └── TopicMissing           a topic it needs does not exist (a LookupError too)
    ├── UsageError                 a command line or a file the CLI cannot use at all (exit 2)
    ├── ForkServerGone             the fork server exited: a job's child is started another way (a ConnectionError too)
    ├── EngineUnreachable          the engine a job runs on (a Ray cluster) does not answer: the job waits (a
    │                              ConnectionError too)
    ├── IllegalTransition          (daemon.job.lifecycle) a move the job's state machine does not have: a bug
    ├── LogsError                  (daemon.cli.log_endpoint) a request's log cannot be read from its host
    ├── DeadlineExceeded           (daemon.ops.http_connections) a connection to the endpoint ran past its request's
    │                              deadline (a TimeoutError too)
    ├── StoreError                 (daemon.store.checkpoints) the checkpoint store could not be read or written
    ├── Untrusted                  (daemon.store.documents) a store's document or file not the fleet's, or unsafe:
    │                              skipped, never acted on
    ├── Unsealed                   (daemon.kafka.queue_seal) a queue record's signature header that is not one
    │                              (a ValueError too)
    ├── WeightsUnreadable          (daemon.resources.memory) a model's safetensors headers cannot be read: no estimate
    │                              (a ValueError too)
    ├── Stale                      (daemon.fleet.moves) a move of a record read before a rebalance: not made, read again
    └── JobFailed                  (handlers.protocol) a job could not finish: a `failed` event
        └── PushFailed             the artifact could not be written to its sink

`tests/test_errors.py` holds every exception class of daemon/ and schemas/ to this tree.

`code` values are part of the wire contract (`handlers.protocol.FailureCode`): they appear in `failed`
events, and consumers branch on them, so they never change meaning.
"""

from __future__ import annotations

from handlers.protocol import FailureCode, JobFailed
from schemas.common import AdapterdError

__all__ = [
    "AdapterdError",
    "ConfigError",
    "EngineUnreachable",
    "ForkServerGone",
    "JobFailed",
    "PushFailed",
    "TopicMissing",
    "UsageError",
]


class ConfigError(AdapterdError):
    """The daemon's own settings are wrong; raised at start, before anything is consumed."""


class TopicMissing(ConfigError, LookupError):
    """A topic the daemon reads or writes does not exist on the cluster (`adapterd topics` creates them)."""


class UsageError(AdapterdError):
    """A command line or a file the CLI cannot use at all: said in one line, exit 2."""


class ForkServerGone(AdapterdError, ConnectionError):
    """The fork server exited before it answered: the job's child is started another way."""


class EngineUnreachable(AdapterdError, ConnectionError):
    """The engine a job is run on (the operator's Ray cluster) does not answer: the job waits for it, not failed."""


class PushFailed(JobFailed):
    """The trained artifact could not be written to its sink; the artifact stays on disk."""

    def __init__(self, code: FailureCode, message: str, *, retryable: bool) -> None:
        super().__init__(code, "push", message, retryable=retryable)
