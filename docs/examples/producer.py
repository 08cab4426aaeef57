"""Publish a training request to adapterd, with nothing but pydantic, aiokafka and adapterd's
`schemas/` package (no torch, no TRL):

    python docs/examples/producer.py kafka.internal:9092 request.json [topic] [--key search-producer-key.pem]

With `--key`, the team's private key (`adapterd keys DIR --team search`), the request is signed: a fleet
whose teams are bound to keys (deploy/README.md, "Priority classes and teams") takes a request only with
its team's signature over exactly the bytes sent (schemas.signing, which needs `cryptography`).

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
from schemas.signing import EventSigner, producer_headers


async def publish(bootstrap_servers: str, path: Path, topic: str = "adapterd.requests", key: Path | None = None) -> int:
    request = decode_request(path.read_bytes())
    if isinstance(request, Rejection):
        for error in request.errors:
            print(f"{path}: {error.path or '(request)'}: {error.message}", file=sys.stderr)
        return 1
    value = path.read_bytes()  # signed and sent as they are: the signature covers exactly these bytes
    headers = producer_headers(EventSigner.from_file(key), value) if key is not None else []
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=request.request_id.encode(), headers=headers)
    finally:
        await producer.stop()
    print(f"published {request.method} request {request.request_id} to {topic}")
    return 0


if __name__ == "__main__":
    arguments = sys.argv[1:]
    signing_key = None
    if "--key" in arguments:
        at = arguments.index("--key")
        signing_key, arguments = Path(arguments[at + 1]), arguments[:at] + arguments[at + 2 :]
    try:
        sys.exit(asyncio.run(publish(arguments[0], Path(arguments[1]), *arguments[2:3], key=signing_key)))
    except KeyboardInterrupt:  # Ctrl-C: the producer was closed on the way out (`finally`), no traceback to show
        sys.exit(130)
