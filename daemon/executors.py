"""The daemon's worker threads: a bounded pool for each kind of blocking work, none of them the
event loop's default executor, so one kind cannot take every thread from another.

- `decode`: decoding, validating and scanning a large request, and checking its signatures (daemon/decoding.py:
  for intake, the fleet's dispatcher and its announcer);
- `admission`: judging a valid request with inline images (daemon/admission/judge.py through
  intake), whose headers it reads;
- `headers`: reading models' safetensors headers for the memory estimate (daemon/resources/headers.py);
- `hub`: Hub calls: pushes, finding an earlier push, whose the token is;
- `ray`: calls to the Ray cluster's Jobs API (daemon/children/ray_jobs.py), which block;
- `retention`: passes of retention over the jobs' folders (daemon/store/retention.py);
- `verify`: checking the signatures of records read in bulk, and parsing them (the table's reader,
  daemon/table/reader.py, through `run_chunks`): Ed25519's verify releases the interpreter, so one
  thread a core verifies beside the loop and on every core.
- `parse`: parsing and hashing the table's records as a reader polls them (daemon/table/reader.py), one thread.
- `table`: the table's keeper: verifying, parsing and folding events, verifying and signing entries, a batch at
  a time (daemon/table/keeper.py). Ed25519's verification releases the interpreter, so two threads verify
  beside the loop and on both cores.

The loop shares the interpreter with these threads: it gives it up at every socket call and select, and waits for
it back while a thread parses. Under CPython's default switch interval (5 ms) each such wait can last 5 ms for each
thread holding it, and a restarted fleet host's loop, whose steps make dozens of socket calls while the table's
threads parse, was held 100 to 360 ms at a time (the convoy effect; benchmarks.fleet_scale). `favour_the_loop` sets
the daemon's interval to SWITCH_INTERVAL_S: a thread holding the interpreter hands it over within 1 ms.

Seven model files that never answered once held every thread of the default executor, and a
64 KiB request then waited 15 s to be decoded (issue 46): now header reads wait behind header
reads only, and each of them ends by its own deadline (daemon/resources/headers.py). A thread still
busy when the loop stops waiting for it (a timeout) stays taken until its work returns: that is
why every kind's work has its own bound, and why the pools are bounded at all.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, ParamSpec, TypeVar

Kind = Literal["decode", "admission", "headers", "hub", "retention", "verify", "parse", "table", "order", "ray"]
# Threads of each kind. Decoding and judging are Python code holding the interpreter most of
# the time: more threads than the cores would not go faster. Header reads and Hub calls wait on the
# network: more of them at once; the header reads of one request are started together.
# Verifying is mostly outside the interpreter (the signature's arithmetic): a thread a core. The keeper's
# pool is its own, so the table's keeping never takes the threads a command or the fleet's view reads with.
THREADS: dict[Kind, int] = {
    "decode": 2,
    "admission": 2,
    "headers": 8,
    "hub": 8,
    "retention": 1,
    "verify": max(1, os.cpu_count() or 1),
    # Parsing the table's records holds the interpreter (pydantic's JSON parser): a second thread parses no faster,
    # and takes the interpreter from the loop as often again (a restarted fleet host's view loads 22,605 heads).
    "parse": 1,
    "table": 2,
    "order": 1,  # the fleet's order of thousands of waiting requests, worked out beside the loop (the announcer's)
    "ray": 4,  # calls to a Ray cluster's Jobs API (daemon/children/ray_jobs.py): waits on the network
}

SWITCH_INTERVAL_S = 0.001  # the daemon's interpreter switch interval (CPython's default: 0.005)

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R")

_pools: dict[Kind, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def favour_the_loop() -> float:
    """Set the interpreter's switch interval to SWITCH_INTERVAL_S (the module's docstring), for the daemon's process;
    the interval set."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    return sys.getswitchinterval()


def pool(kind: Kind) -> ThreadPoolExecutor:
    """The pool of `kind`, started at its first use (the threads themselves start as work comes)."""
    with _lock:
        if kind not in _pools:
            _pools[kind] = ThreadPoolExecutor(max_workers=THREADS[kind], thread_name_prefix=f"adapterd-{kind}")
        return _pools[kind]


async def run(kind: Kind, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`function(*args, **kwargs)` in a thread of `kind`'s pool, with the caller's context (structlog's
    bound values), as `asyncio.to_thread` does in the default executor."""
    call = functools.partial(contextvars.copy_context().run, function, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(pool(kind), call)


async def run_chunks(kind: Kind, function: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """`[function(item) for item in items]`, in order, the items cut into one run of consecutive items for each of
    `kind`'s threads (a few calls into the pool for a batch, not one per item)."""
    if not items:
        return []
    size = -(-len(items) // THREADS[kind])
    chunks = [items[start : start + size] for start in range(0, len(items), size)]
    done = await asyncio.gather(*(run(kind, _each, function, chunk) for chunk in chunks))
    return [result for chunk in done for result in chunk]


def _each(function: Callable[[T], R], chunk: Sequence[T]) -> list[R]:
    return [function(item) for item in chunk]
