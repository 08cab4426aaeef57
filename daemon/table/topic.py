"""The state topic as Kafka knows it: the configuration that makes it a table (compacted, and compacted while
quiet), and the keepers' consumer group, whose committed offsets on the events topic say how far the table is kept
(a reader folds the events past them on top of the table: daemon/table/reader.py)."""

from __future__ import annotations

# What `adapterd topics` creates the state topic with, and `adapterd doctor` checks (defined with the other topics'
# configurations, in the Kafka layer below this one, where `adapterd topics` makes them).
from daemon.kafka.admin.topics import COMPACTED as COMPACTED


def keeper_group(group_id: str) -> str:
    """The consumer group of the table's keepers on the events topic (daemon/table/keeper.py)."""
    return f"{group_id}.table"
