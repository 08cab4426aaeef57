"""Publish a training request to adapterd, with nothing but pydantic, aiokafka and adapterd's
`schemas/` package (no torch, no TRL):

    python docs/examples/producer.py kafka.internal:9092 request.json

The request is checked with the daemon's own decoder first (a bad field is named here, not in a
`rejected` event later), then published to `adapterd.requests` keyed by its request id: its events
carry the same key. With kcat instead: `kcat -P -b kafka.internal:9092 -t adapterd.requests -k ID request.json`
(one message, the file's bytes; then `adapterd validate request.json` is the check).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiokafka import AIOKafkaProducer

from schemas import Rejection, decode_request


async def publish(bootstrap_servers: str, path: Path, topic: str = "adapterd.requests") -> int:
    request = decode_request(path.read_bytes())
    if isinstance(request, Rejection):
        for error in request.errors:
            print(f"{path}: {error.path or '(request)'}: {error.message}", file=sys.stderr)
        return 1
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(topic, path.read_bytes(), key=request.request_id.encode())
    finally:
        await producer.stop()
    print(f"published {request.method} request {request.request_id} to {topic}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(publish(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:4])))
