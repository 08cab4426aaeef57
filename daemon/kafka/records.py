"""What the daemon reads of a Kafka record: a `Protocol` that aiokafka's `ConsumerRecord` satisfies,
and that a test builds without a broker (aiokafka ships no type information, so its own class
would type as Any).

Every part of a record is a producer's input: a key or header value may be null, a header's
value any bytes, its name any of ours, its timestamp any 64-bit number."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Record(Protocol):
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...  # milliseconds since the epoch
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]]: ...  # Kafka allows a null header value
