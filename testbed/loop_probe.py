"""`adapterd` with a probe on its event loop, for benchmarks/fleet_scale.py: the loop's lag, when the fleet's view
is whole, and the CPU of each of its tasks.

    LOOP_PROBE_FILE=probe.json python -m testbed.loop_probe run

runs `adapterd run` (any command) on a loop that, besides the daemon's own work:
- wakes every 10 ms and keeps each wake-up's lateness over 5 ms (`lags`: time, seconds): the loop's lag, the longest
  any callback or task step held it;
- notes when each `FleetView` made in the process has `caught_up` set (`view_whole_at`, epoch seconds);
- keeps every task step that held the loop over LONG_STEP_S, with where it resumed and where it stopped
  (`long_steps`), and every garbage collection that long (`long_collections`: it holds every thread);
- times every step of every task with the thread's CPU clock (`time.thread_time`), under the task's label: its name
  when it was given one (the daemon names its long-lived tasks: `fleet-announcer`, `fleet-dispatcher`), else its
  parent task's label (a task started by the announcer is the announcer's work: its Kafka client's fetches), else its
  coroutine's name; and the CPU of whatever a task hands to a thread pool (`ThreadPoolExecutor.submit` from the
  loop's thread: `asyncio.to_thread`, the daemon's executors) under the same label. Callbacks run outside any task
  (the Kafka client's socket reads) are in the process's CPU only.
Every half second (from a thread of its own, so a held loop does not hold it) it writes all of that, with the
process's CPU time, to the file.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

TICK_S = 0.01
KEPT_LAG_S = 0.005
WRITE_S = 0.5

_cpu: defaultdict[str, float] = defaultdict(float)
_pool_cpu: defaultdict[str, float] = defaultdict(float)
_lags: list[tuple[float, float]] = []
_views: list[Any] = []
_whole: list[float] = []
_loop_thread: list[int] = []
LONG_STEP_S = 0.05
# The task steps that held the loop over LONG_STEP_S: when, how long, the task's label and coroutine, and where it
# resumed and was suspended again (its innermost await's file, line and function).
_steps: list[tuple[float, float, str, str, str]] = []


_collections: list[tuple[float, float, int]] = []  # the garbage collections over LONG_STEP_S: when, how long, gen
_collecting: list[float] = []


def _collected(phase: str, info: dict[str, Any]) -> None:
    """gc's callback: a collection's time, kept where it held every thread over LONG_STEP_S."""
    if phase == "start":
        _collecting[:] = [time.perf_counter()]
    elif _collecting and (held := time.perf_counter() - _collecting[0]) > LONG_STEP_S:
        _collections.append((time.time(), held, int(info.get("generation", -1))))


def _awaiting(coro: Any) -> str:
    """Where a coroutine is suspended: its innermost awaited coroutine's frame."""
    frame = None
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or frame
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename.rpartition('/')[2]}:{frame.f_lineno} {frame.f_code.co_name}"


class _Timed(Coroutine[Any, Any, Any]):
    """A task's coroutine, each step timed under its task's label."""

    def __init__(self, coro: Coroutine[Any, Any, Any], parent: _Timed | None) -> None:
        self.coro = coro
        self.parent = parent
        self.task: asyncio.Task[Any] | None = None

    def label(self) -> str:
        name = self.task.get_name() if self.task is not None else ""
        if name and not name.startswith("Task-"):
            return name
        if self.parent is not None:
            return self.parent.label()
        return getattr(self.coro, "__qualname__", type(self.coro).__name__)

    def send(self, value: Any) -> Any:
        started, wall = time.thread_time(), time.perf_counter()
        where = _awaiting(self.coro)
        try:
            return self.coro.send(value)
        finally:
            _cpu[self.label()] += time.thread_time() - started
            held = time.perf_counter() - wall
            if held > LONG_STEP_S:
                name = f"{self.label()} {getattr(self.coro, '__qualname__', '')}"
                _steps.append((time.time(), held, name, where, _awaiting(self.coro)))

    def throw(self, *args: Any) -> Any:
        started = time.thread_time()
        try:
            return self.coro.throw(*args)
        finally:
            _cpu[self.label()] += time.thread_time() - started

    def close(self) -> None:
        self.coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        return self.coro.__await__()


def _current() -> _Timed | None:
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return None
    coro = task.get_coro() if task is not None else None
    return coro if isinstance(coro, _Timed) else None


def _factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
    timed = _Timed(coro, _current())
    task = asyncio.Task(timed, loop=loop, **kwargs)
    timed.task = task
    return task


_submit = ThreadPoolExecutor.submit


def _timed_submit(self: ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
    if not _loop_thread or threading.get_ident() != _loop_thread[0]:
        return _submit(self, fn, *args, **kwargs)
    owner = _current()
    label = owner.label() if owner is not None else "(no task)"

    def timed(*a: Any, **k: Any) -> Any:
        started = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            _pool_cpu[label] += time.thread_time() - started

    return _submit(self, timed, *args, **kwargs)


def _tick(loop: asyncio.AbstractEventLoop, due: float) -> None:
    now = loop.time()
    if now - due > KEPT_LAG_S:
        _lags.append((time.time(), now - due))
    if not _whole and any(view.caught_up.is_set() for view in _views):
        _whole.append(time.time())
    loop.call_at(now + TICK_S, _tick, loop, now + TICK_S)


class _Policy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        loop = super().new_event_loop()
        loop.set_task_factory(_factory)
        loop.call_soon(_started, loop)
        return loop


def _started(loop: asyncio.AbstractEventLoop) -> None:
    _loop_thread.append(threading.get_ident())
    _tick(loop, loop.time())


def _write(path: Path) -> None:
    while True:
        state = {
            "time": time.time(),
            "process_cpu": time.process_time(),
            "cpu": dict(_cpu),
            "pool_cpu": dict(_pool_cpu),
            "lags": list(_lags),
            "long_steps": list(_steps),
            "long_collections": list(_collections),
            "view_whole_at": _whole[0] if _whole else None,
            "views": len(_views),
        }
        partial = path.with_suffix(".part")
        partial.write_text(json.dumps(state))
        partial.replace(path)
        time.sleep(WRITE_S)


def _watch_views() -> None:
    from daemon.fleet.view import FleetView

    made = FleetView.__init__

    def init(self: FleetView, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        _views.append(self)

    FleetView.__init__ = init  # type: ignore[method-assign]


def main() -> None:
    path = Path(os.environ["LOOP_PROBE_FILE"])
    asyncio.set_event_loop_policy(_Policy())
    ThreadPoolExecutor.submit = _timed_submit  # type: ignore[method-assign,assignment]
    gc.callbacks.append(_collected)
    _watch_views()
    threading.Thread(target=_write, args=(path,), daemon=True, name="loop-probe").start()
    from daemon.cli.app import app

    sys.argv[0] = "adapterd"
    app()


if __name__ == "__main__":
    main()
