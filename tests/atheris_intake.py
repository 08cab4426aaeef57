"""Coverage-guided fuzzing (atheris, libFuzzer) of intake's decision: decoding, the host's refusals
(policy, bounds, inline images) and building the rejection's DLQ record and event, on whatever
bytes libFuzzer makes, seeded with the shipped examples and tests/corpus/hostile/.

The property: nothing raises, and every rejection's `rejected` event and DLQ record serialise
within the broker's message size. A crash leaves its input in `crash-*` (libFuzzer's own naming)
beside where it runs; add it to tests/corpus/hostile/ once fixed.

    uv run python -m tests.atheris_intake -max_total_time=600 /tmp/corpus tests/corpus/hostile schemas/examples

is the long run; tests/schemas/test_fuzz_atheris.py runs it for a bounded number of inputs in CI.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["schemas", "daemon"]):
    from aiokafka.structs import ConsumerRecord

    from daemon.admission.judge import refusal
    from daemon.intake import Intake
    from daemon.kafka.publisher import Publisher
    from daemon.ops.logs import configure_logging
    from daemon.resources.slots import Slots
    from daemon.settings import Settings
    from schemas import Rejected, Rejection, decode_request

MAX_MESSAGE_BYTES = 1_000_000


async def _publisher(settings: Settings) -> Publisher:
    return Publisher(settings)  # built in a loop (aiokafka's producer asks for one); never started


configure_logging("json", "error")  # a warning per rejection would be most of the time
SETTINGS = Settings(
    work_dir=Path("/tmp/adapterd-atheris"),
    gpus=[],
    allowed_local_dataset_roots=[Path("/data")],
    allowed_dataset_urls=["s3://bucket/*"],
)
INTAKE = Intake(SETTINGS, asyncio.run(_publisher(SETTINGS)), None, None, Slots([], 1))  # type: ignore[arg-type]  # for its rejection messages


def test_one_input(data: bytes) -> None:
    record = ConsumerRecord("requests", 0, 0, 0, 0, b"fuzz-key", data, None, 8, len(data), [])
    decoded = decode_request(data, record.key)
    rejection = decoded if isinstance(decoded, Rejection) else refusal(decoded, SETTINGS, Slots([], 1))
    if rejection is None:
        return
    letter, event = INTAKE.rejection_messages(record, rejection)
    assert len(event.value) < MAX_MESSAGE_BYTES and sum(len(v) for _, v in letter.headers) < MAX_MESSAGE_BYTES
    Rejected.model_validate_json(event.value)


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
