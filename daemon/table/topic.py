"""The state topic as Kafka knows it: the configuration that makes it a table (compacted, and compacted while
quiet), and the keepers' consumer group, whose committed offsets on the events topic say how far the table is kept
(a reader folds the events past them on top of the table: daemon/table/reader.py)."""

from __future__ import annotations

# What `adapterd topics` creates the state topic with, and `adapterd doctor` checks: compaction keeps each key's
# latest record; the active segment rolls every hour (`segment.ms`) so a quiet table compacts too (the cleaner never
# touches the active segment); a tombstone stays a day (`delete.retention.ms`) so a reader part-way through sees it.
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": str(3_600_000),
    "min.cleanable.dirty.ratio": "0.1",
    "delete.retention.ms": str(86_400_000),
}


def keeper_group(group_id: str) -> str:
    """The consumer group of the table's keepers on the events topic (daemon/table/keeper.py)."""
    return f"{group_id}.table"
