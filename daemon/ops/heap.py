"""The daemon's start-up heap, set apart from the garbage collector's full collections.

What the daemon imports and builds before its first poll (modules, pydantic's validators, the
credential rules, the Kafka clients: some 120,000 objects the collector tracks) lives as long as it
does. CPython's full collection walks every tracked object, and the intake path makes them happen:
a fetch's records and the batches built from them outlive the young generations. Each walked the
start-up heap again, 7 to 10 us a rejected message in benchmarks/reject_path.py (one full collection
over 10,000 messages; issue 52). `gc.freeze` moves those objects to the permanent generation, which
collections skip; everything made later is collected as before.

`full_collections_held` holds the oldest generation's automatic collections off while the table of requests is read
(daemon/table/reader.py: the fleet's view, `adapterd jobs`).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


def freeze_startup_heap() -> int:
    """Set the objects that exist now apart from later collections; how many they are. What is
    already garbage is collected first, so that nothing unreachable is kept for ever."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@contextlib.contextmanager
def full_collections_held() -> Iterator[None]:
    """No automatic collection of the oldest generation while the table loads. The load makes hundreds of thousands of
    objects that live until it ends (the entries and their events), and each full collection, which the interpreter
    starts as the heap grows by a quarter, walks them all while holding every thread, the event loop's too: 0.5 to 1.8 s
    each with 20,000 requests on a loaded machine of 2 cores. The young generations are collected as ever; the
    thresholds are set back after, whether the load ended or failed (the brokers away: only for that try). Nested, the
    inner one sets back what the outer one set."""
    young, middle, oldest = gc.get_threshold()
    gc.set_threshold(young, middle, 1 << 30)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, oldest)
