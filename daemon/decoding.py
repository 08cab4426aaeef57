"""One way to decode a record of a request, intake's, for every reader of requests: intake, the fleet's dispatcher
(its heads) and announcer, and the CLI's list of waiting requests (`adapterd jobs --state queued`, `get`, the sweep of
`cancel`). A record is the same request, or the same rejection, wherever it is read: a request one of them took and
another refused would be claimed, or told it waits, only to be dead-lettered by the next.

The rules, in order:
- `schemas.decode_request` with the daemon's credential rules (daemon/admission/secret_rules.py `SCANNER`: adapterd's
  own and detect-secrets'; the schemas' built-in ones alone let through what only detect-secrets knows);
- the size bound: a request whose retry and DLQ copies would not fit the brokers' largest record is refused (`policy`,
  naming the limit: daemon/kafka/copies.py `too_large`).

A record below OFF_LOOP_BYTES (most of them, thousands a second on intake's rejection path, where a thread's hop would
cost more than the work) is decoded where it is asked for; from OFF_LOOP_BYTES, in a thread of the `decode` pool
(daemon/executors.py), where parsing, validating and scanning grow with the content (a 1 MB request of short strings:
tens of milliseconds of scan; ~120 ms in all on a loaded host). The thread runs Python code that gives up the
interpreter every few milliseconds, so the loop keeps turning beside it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from daemon import executors
from daemon.kafka.copies import too_large
from daemon.kafka.records import Record
from schemas import Rejection, RequestBase, decode_request
from schemas.secrets import SecretScanner

# From this size a record is decoded, and its signatures checked, in a worker thread.
OFF_LOOP_BYTES = 65_536
T = TypeVar("T")


@functools.cache
def scanner() -> SecretScanner:
    """The daemon's credential rules, built at their first use: importing detect-secrets and compiling the rules into
    one RE2 automaton takes ~0.5 s, which a CLI command that finds no waiting record need not pay. The daemon builds
    them as it starts (`Intake`), not at its first record's decode on the loop."""
    from daemon.admission.secret_rules import SCANNER

    return SCANNER


def decoded_now(record: Record, max_message_bytes: int) -> RequestBase | Rejection:
    """The record's request, or why it is none, decoded here and now: in the `decode` pool's thread, or by the CLI
    (a command has no loop to keep turning). Never raises for bad input."""
    decoded = decode_request(record.value, record.key, scanner=scanner())
    if isinstance(decoded, Rejection):
        return decoded  # its own errors first: a field to fix says more than a size
    oversize = too_large(record, max_message_bytes)
    return decoded if oversize is None else Rejection("policy", [oversize], decoded.request_id)


def decoded_on_loop(record: Record, max_message_bytes: int) -> RequestBase | Rejection | None:
    """`decoded`'s part on the loop, without a coroutine (intake calls it for each record): a small record decoded;
    None for one of OFF_LOOP_BYTES or more, left to the thread."""
    return decoded_now(record, max_message_bytes) if len(record.value or b"") < OFF_LOOP_BYTES else None


async def decoded(record: Record, max_message_bytes: int) -> RequestBase | Rejection:
    """The record's request, or why it is none: on the loop below OFF_LOOP_BYTES, else in a thread of the `decode`
    pool."""
    on_loop = decoded_on_loop(record, max_message_bytes)
    return on_loop if on_loop is not None else await executors.run("decode", decoded_now, record, max_message_bytes)


async def checked(record: Record, check: Callable[..., T], *args: Any) -> tuple[T, bool]:
    """`check(*args)` of a check that verifies a signature over the record's value, which hashes every byte: on the
    loop for a small record (~0.1 ms), in a thread of the `decode` pool from OFF_LOOP_BYTES; and whether it awaited."""
    if len(record.value or b"") < OFF_LOOP_BYTES:
        return check(*args), False
    return await executors.run("decode", check, *args), True
