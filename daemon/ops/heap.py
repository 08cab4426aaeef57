"""The daemon's start-up heap, set apart from the garbage collector's full collections.

What the daemon imports and builds before its first poll (modules, pydantic's validators, the
credential rules, the Kafka clients: some 120,000 objects the collector tracks) lives as long as it
does. CPython's full collection walks every tracked object, and the intake path makes them happen:
a fetch's records and the batches built from them outlive the young generations. Each walked the
start-up heap again, 7 to 10 us a rejected message in benchmarks/reject_path.py (one full collection
over 10,000 messages; issue 52). `gc.freeze` moves those objects to the permanent generation, which
collections skip; everything made later is collected as before.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Set the objects that exist now apart from later collections; how many they are. What is
    already garbage is collected first, so that nothing unreachable is kept for ever."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
