"""Coverage-guided fuzzing (atheris, libFuzzer) of whole records, not only values (issue 37): the
fuzzer's bytes are read as a Kafka record (key, value, headers, timestamp) and driven through
`Intake.take` on the in-memory fakes (tests/core.py), a fresh core per input, on one event loop.

Properties, for every record (those of tests/daemon/intake/test_fuzz_records.py, its Hypothesis twin):
nothing raises out of intake; exactly one outcome (a `rejected` event with its DLQ record, or
`accepted` and one terminal event) and the record is committed; a rejection names its errors (a
valid `rejected` event with at least one error, each with a message, and the DLQ's
`adapterd-errors` header) and is not `internal` (the guard that keeps the daemon up met a bug); the
daemon's DLQ copies fit `max_message_bytes`. A failing property raises, so libFuzzer records a
crash: its input lands in `crash-*` beside where it runs; add it to tests/corpus/records/ once fixed.

How bytes map to a record (`record_of`; `encode` is its inverse, for writing corpus files). Bytes
past the end read as 0 (or as empty), so every input is a record:

    byte 0   flags: bit 0 the key is not null; bits 1-2 how the value is made:
             0 the rest of the input, raw; 1 a seed request with the rest spliced in before its
             closing brace (`, "request_id": "x"` makes a duplicate key); 2 a seed request padded
             to near the size limit: 2 more bytes (big-endian) n, a string of LIMIT - 16384 + n % 16400
             bytes (both sides of a request's limit, LIMIT - 8192, and of LIMIT) as its dataset's
             one inline row (bit 3 clear; a seed that is not a JSON object: as bit 3 set) or in
             its metadata (bit 3 set); 3 a null value
    byte 1   which seed request (`SEEDS`, modulo their number): a valid SFT request, one with an
             inline image, one with LoRA patterns, then tests/corpus/hostile/*.json in name order
    byte 2   timestamp: 0 → 0, 1 → -1, 2 → -2**63, 3 → 2**63 - 1, b → (b - 4) * 10**11 ms
    key      (if bit 0) a length byte, then that many bytes
    headers  a count byte (modulo 16), then each header: a name byte n, n < 128 the daemon's own
             name `NAMES[n % len(NAMES)]`, else a name of the next (n - 128) % 32 bytes (UTF-8,
             bad bytes replaced); then a value length byte, 255 a null value, else that many bytes
    rest     the value's material (see bits 1-2)

    uv run python -m tests.atheris_records -max_total_time=300 /tmp/reccorpus tests/corpus/records

is the long run; tests/daemon/intake/test_fuzz_atheris_records.py runs it for a bounded number of inputs
in CI and replays tests/corpus/records/ (`python -m tests.atheris_records --write-corpus` rewrites
the seeds there, `CORPUS`; its `found-*` files are crashes the fuzzer found:
`found-null-attempt-internal`, 02 00 ff 02 00 ff ff, is the valid seed request with a null
`adapterd-attempt` and an empty header, found from an empty corpus in seconds with the null-header
check of daemon/kafka/retry_state.py taken out: `internal`, a TypeError while signing).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["schemas", "daemon"]):
    from daemon.cli.demo.requests import VISION_CHAT_ROWS
    from daemon.kafka.retry_state import RETRY_HEADERS
    from daemon.ops.logs import configure_logging
    from daemon.settings import Settings
    from schemas import Rejected
    from tests.core import CoreOnFakes
    from tests.daemon.core.test_scheduler_core import SUCCEEDS
    from tests.fakes import FakeChildren, FakeRecord
    from tests.helpers import sft_request

ROOT = Path(__file__).parents[1]
LIMIT = 65_536
NAMES = (
    *RETRY_HEADERS,
    "traceparent",
    "tracestate",
    "adapterd-reason",
    "adapterd-errors",
    "adapterd-event-type",
    "adapterd-schema-version",
    "adapterd-source-offset",
    "adapterd-value-omitted",
    "adapterd-request-id",
    "",
)
TIMESTAMPS = (0, -1, -(2**63), 2**63 - 1)


def _raw(document: dict[str, object]) -> bytes:
    return json.dumps(document).encode()


SEEDS = [
    _raw(sft_request("fuzz-valid")),
    _raw(sft_request("fuzz-image", dataset={"rows": VISION_CHAT_ROWS[:1]})),
    _raw(
        sft_request(
            "fuzz-patterns",
            peft={
                "r": 4,
                "lora_alpha": 8,
                "target_modules": ["q_proj", "v_proj"],
                "rank_pattern": {"^model\\..*q_proj$": 8},
                "alpha_pattern": {"(v|q)_proj": 16},
            },
        )
    ),
    *(path.read_bytes() for path in sorted((ROOT / "tests" / "corpus" / "hostile").glob("*.json"))),
]


def _document(raw: bytes) -> dict[str, object] | None:
    try:
        document = json.loads(raw)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


SEED_DOCUMENTS = [_document(raw) for raw in SEEDS]
Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        self.at += 1
        return self.data[self.at - 1] if self.at <= len(self.data) else 0

    def take(self, n: int) -> bytes:
        self.at += n
        return self.data[self.at - n : self.at]

    def rest(self) -> bytes:
        return self.data[min(self.at, len(self.data)) :]


def record_of(data: bytes) -> Record:
    """The record these bytes stand for (the module's docstring gives the layout)."""
    read = _Reader(data)
    flags, index, stamp = read.byte(), read.byte() % len(SEEDS), read.byte()
    seed = SEEDS[index]
    timestamp = TIMESTAMPS[stamp] if stamp < len(TIMESTAMPS) else (stamp - 4) * 10**11
    key = read.take(read.byte()) if flags & 1 else None
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(read.byte() % 16):
        n = read.byte()
        name = NAMES[n % len(NAMES)] if n < 128 else read.take((n - 128) % 32).decode(errors="replace")
        length = read.byte()
        headers.append((name, None if length == 255 else read.take(length)))
    mode = (flags >> 1) & 3
    value: bytes | None
    if mode == 0:
        value = read.rest()
    elif mode == 1:
        value = seed[:-1] + read.rest() + b"}"
    elif mode == 2:
        size = LIMIT - 16384 + int.from_bytes(read.take(2).ljust(2, b"\0"), "big") % 16400
        if (
            flags & 8 or SEED_DOCUMENTS[index] is None
        ):  # in its metadata (a value of at most 1024 characters: rejected, naming it)
            pad = b'"p": "' + b"a" * size + b'"'
            value = (
                seed.replace(b'"metadata": {', b'"metadata": {' + pad + b", ", 1)
                if b'"metadata": {' in seed
                else seed[:-1] + b', "metadata": {' + pad + b"}}"
            )
        else:  # as its dataset: one inline row of text
            value = _raw({**SEED_DOCUMENTS[index], "dataset": {"rows": [{"text": "a" * size}]}})
    else:
        value = None
    return key, value, headers, timestamp


def encode(
    key: bytes | None,
    headers: list[tuple[int | str, bytes | None]],
    *,
    mode: int = 1,
    seed: int = 0,
    stamp: int = 0,
    rest: bytes = b"",
    bits: int = 0,
) -> bytes:
    """The bytes `record_of` reads as this record; a header's name is an index into NAMES or a name of its own."""
    out = bytearray([(key is not None) | mode << 1 | bits, seed, stamp])
    if key is not None:
        out += bytes([len(key)]) + key
    out.append(len(headers))
    for name, value in headers:
        if isinstance(name, int):
            out.append(name)
        else:
            out += bytes([128 + len(name.encode())]) + name.encode()
        out += bytes([255]) if value is None else bytes([len(value)]) + value
    return bytes(out + rest)


def _name(name: str) -> int:
    return NAMES.index(name)


# The checked-in seeds of tests/corpus/records/ (`--write-corpus`): name → bytes.
CORPUS = {
    "valid-null-attempt": encode(b"fuzz-valid", [(_name("adapterd-attempt"), None)]),
    "header-not-utf8": encode(
        b"fuzz-valid", [(_name("traceparent"), b"\xff\xfe00-" + b"\x80" * 8), ("x-\u00e9", b"\xc3\x28")]
    ),
    "forged-not-before": encode(
        b"fuzz-valid",
        [
            (_name("adapterd-attempt"), b"99"),
            (_name("adapterd-not-before"), b"inf"),
            (_name("adapterd-retry-signature"), b"00" * 32),
        ],
    ),
    "duplicate-key": encode(b"fuzz-valid", [], rest=b', "request_id": "fuzz-other"'),
    "at-request-limit": encode(
        b"fuzz-valid", [(_name("adapterd-reason"), b"internal")], mode=2, rest=(7824).to_bytes(2, "big")
    ),
    "over-request-limit": encode(
        b"fuzz-valid", [(_name("adapterd-errors"), b"x" * 200)], mode=2, rest=(7825).to_bytes(2, "big")
    ),
    "at-broker-limit": encode(
        None,
        [(_name("traceparent"), b"00-" + b"0" * 32 + b"-" + b"0" * 16 + b"-01")],
        mode=2,
        rest=(16026).to_bytes(2, "big"),
    ),
    "metadata-near-limit": encode(b"fuzz-valid", [], mode=2, rest=(7824).to_bytes(2, "big"), bits=8),
    "image": encode(b"fuzz-image", [(_name("tracestate"), b"a=b")], seed=1, stamp=2),
    "patterns": encode(b"fuzz-patterns", [], seed=2, stamp=3),
    "null-value": encode(None, [(_name(""), None)], mode=3, stamp=1),
    "raw-not-json": encode(b"\x00\xff", [], mode=0, rest=b'\xff{"schema_version": 1'),
}


async def _take(record: FakeRecord, work: Path) -> CoreOnFakes:
    core = CoreOnFakes(
        Settings(
            gpus=[], warm_child=False, work_dir=work, hub_token=None, max_message_bytes=LIMIT, progress_interval_s=0
        ),
        children=FakeChildren(SUCCEEDS),
    )
    await core.intake.take(core.tp, [record])
    await core.partitions.settled(core.tp)
    job = core.scheduler.jobs.get(core.tp)
    if job is not None:
        await job.task
    return core


def _settle(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what an input left running, so that the next starts on an idle loop."""
    left = asyncio.all_tasks(loop)
    for task in left:
        task.cancel()
    if left:
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))


configure_logging("json", "error")  # a warning per rejection would be most of the time
LOOP = asyncio.new_event_loop()


def check(data: bytes) -> None:
    """Drive the record these bytes stand for through intake; raise if a property fails."""
    key, value, headers, timestamp = record_of(data)
    record = FakeRecord("requests", 0, 5, key, value, headers, timestamp)
    with tempfile.TemporaryDirectory() as work:
        try:
            core = LOOP.run_until_complete(_take(record, Path(work)))
        finally:
            _settle(LOOP)
    events = [json.loads(m.value) for m in core.producer.on(core.settings.events_topic)]
    types = [event["type"] for event in events]
    terminal = [t for t in types if t in {"rejected", "succeeded", "failed", "cancelled"}]
    assert len(terminal) == 1, types
    letters = core.dead_letters()
    assert (types == ["rejected"]) == (len(letters) == 1), types
    if types == ["rejected"]:
        rejected = Rejected.model_validate(events[0])
        assert rejected.errors and all(error.message for error in rejected.errors), rejected
        assert letters[0].header("adapterd-errors"), letters[0].headers
    assert [m.header("adapterd-reason") for m in letters] != [b"internal"], letters[0].headers
    for copy in letters:
        assert len(copy.key or b"") + len(copy.value) + sum(len(n) + len(v) for n, v in copy.headers) <= LIMIT
    assert core.consumer.committed.get(core.tp) == 6


def write_corpus(folder: Path = ROOT / "tests" / "corpus" / "records") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in CORPUS.items():
        (folder / name).write_bytes(data)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-corpus"]:
        write_corpus()
    else:
        atheris.Setup(sys.argv, check)
        atheris.Fuzz()
