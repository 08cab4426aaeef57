"""The memory estimate never on the Kafka loop's path (issue 46, items 3 to 5): the offer never waits
for it (the partition is held at its record while it is worked out beside the loop), a request's
models are read at once within one deadline, reads that do not answer end by it and give their
thread back, each kind of blocking work has its own threads, and a header no model could have
(a negative or 4,000-digit dimension) is unreadable weights, never a negative share or `internal`.
On the in-memory fakes (tests/core.py), the local Hub and local files."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from daemon import executors
from daemon.decoding import OFF_LOOP_BYTES
from daemon.decoding import decoded as decoded_request
from daemon.resources.estimator import Estimator, MemoryHistory
from daemon.resources.headers import Deadline, read_header
from daemon.resources.memory import Estimate, Tensors, WeightsUnreadable
from daemon.settings import Settings
from handlers.protocol import StageEntered
from schemas import RequestBase, decode_request
from testbed.data import safetensors_header_only, sharded_safetensors
from testbed.hub_server import HubServer
from testbed.memory_kafka import FakeRecord
from tests.core import CoreOnFakes, turns_until
from tests.fakes import FakeChildren, Script
from tests.helpers import sft_request

GIB = 2**30
HANGS = Script(messages=[StageEntered(stage="train")], hang=True)


def small_header(**overrides: list[Any]) -> dict[str, Any]:
    """A two-block model's header: an embedding of 1000 × 64, attention and MLP projections."""
    header: dict[str, Any] = {
        "__metadata__": {"format": "pt"},
        "model.embed_tokens.weight": {"dtype": "BF16", "shape": [1000, 64]},
    }
    for layer in range(2):
        for name, shape in {
            "self_attn.q_proj": [64, 64],
            "self_attn.k_proj": [16, 64],
            "self_attn.v_proj": [16, 64],
            "self_attn.o_proj": [64, 64],
            "mlp.up_proj": [128, 64],
            "mlp.down_proj": [64, 128],
        }.items():
            header[f"model.layers.{layer}.{name}.weight"] = {"dtype": "BF16", "shape": shape}
    for name, shape in overrides.items():
        header[name] = {"dtype": "BF16", "shape": shape}
    return header


def request(request_id: str = "m1", **overrides: Any) -> RequestBase:
    decoded = decode_request(json.dumps(sft_request(request_id, **overrides)).encode())
    assert isinstance(decoded, RequestBase), decoded
    return decoded


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # One declared GPU of 80 GiB (72 for jobs), shared by up to four jobs: estimates are asked for.
    return Settings(
        gpus=["0"],
        max_jobs_per_gpu=4,
        gpu_memory_bytes=80 * GIB,
        gpu_memory_headroom=0.1,
        warm_child=False,
        work_dir=tmp_path / "work",
        hub_token=None,
        progress_interval_s=0,
        allowed_local_model_roots=[tmp_path],
    )


class HeldNeeds:
    """The estimator's seam (`Scheduler.memory`): no model read before; each request's estimate comes
    when the test gives it (`answer`)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.answers: dict[str, asyncio.Future[Estimate | None]] = {}

    def _answer(self, request_id: str) -> asyncio.Future[Estimate | None]:
        return self.answers.setdefault(request_id, asyncio.get_running_loop().create_future())

    def known(
        self, request: RequestBase, *, gradient_checkpointing: bool = True, shards: int = 1
    ) -> tuple[bool, Estimate | None]:
        answer = self.answers.get(request.request_id)
        return (True, answer.result()) if answer is not None and answer.done() else (False, None)

    async def need(
        self, request: RequestBase, *, gradient_checkpointing: bool = True, shards: int = 1
    ) -> Estimate | None:
        self.started.append(request.request_id)
        return await asyncio.shield(self._answer(request.request_id))  # a cancelled wait leaves the answer to come

    def answer(self, request_id: str, need_bytes: int) -> None:
        self._answer(request_id).set_result(Estimate({"weights": need_bytes}, gradient_checkpointing=True))


def record_on(
    core: CoreOnFakes, request_id: str, partition: int, document: dict[str, Any] | None = None
) -> tuple[TopicPartition, FakeRecord]:
    tp = TopicPartition(core.tp.topic, partition)
    core.consumer.committed[tp] = 0
    value = json.dumps(document or sft_request(request_id)).encode()
    return tp, FakeRecord(tp.topic, partition, 7, request_id.encode(), value, [])


async def test_intake_never_waits_for_an_estimate_each_partition_is_held_at_its_record_until_its_own_is_ready(
    settings: Settings,
) -> None:
    core = CoreOnFakes(settings, children=FakeChildren(HANGS))
    needs = HeldNeeds()
    core.scheduler.memory = needs  # type: ignore[assignment]
    taken = [record_on(core, f"r{partition}", partition) for partition in range(3)]
    # Three partitions' records, as the loop hands them over: none of them waits on its headers.
    takes = [asyncio.create_task(core.intake.take(tp, [record])) for tp, record in taken]
    await turns_until(lambda: all(take.done() for take in takes))
    await turns_until(lambda: len(needs.started) == 3)
    assert sorted(needs.started) == ["r0", "r1", "r2"]  # worked out at once, beside the loop
    for tp, _ in taken:
        assert tp in core.consumer.paused and core.consumer.sought[tp] == 7 and core.scheduler.holds(tp)
    assert core.consumer.commits == [] and core.types() == []  # the records stay in Kafka, nothing decided
    (tp0, _), (tp1, record1), (tp2, _) = taken
    needs.answer("r1", 30 * GIB)
    await turns_until(lambda: tp1 not in core.consumer.paused)  # read again: its estimate is ready
    assert {tp0, tp2} <= core.consumer.paused and not core.scheduler.holds(tp1)
    await core.intake.take(tp1, [record1])  # the record read again starts its job with the estimate
    [job] = core.scheduler.jobs.values()
    assert job.request_id == "r1" and job.placement is not None and job.placement.share_bytes == 30 * GIB
    await core.scheduler.stop_jobs()
    assert (
        core.scheduler.estimates.pending == {}
    )  # the others' are dropped: their records are read again after a restart


async def test_after_a_rebalance_a_record_waiting_for_its_estimate_is_read_and_held_again(settings: Settings) -> None:
    core = CoreOnFakes(settings, children=FakeChildren(HANGS))
    needs = HeldNeeds()
    core.scheduler.memory = needs  # type: ignore[assignment]
    tp, record = record_on(core, "r0", 0)
    await core.intake.take(tp, [record])
    await turns_until(lambda: needs.started == ["r0"])
    # A rebalance: aiokafka gives the partition back unpaused, at its committed offset.
    core.consumer.paused.discard(tp)
    await core.scheduler.on_assigned({tp})
    assert not core.scheduler.holds(tp)  # else intake would pass its records by, and lose them
    await core.intake.take(tp, [record])  # read again from the committed offset
    await turns_until(lambda: needs.started == ["r0", "r0"])
    assert tp in core.consumer.paused and core.consumer.sought[tp] == 7  # held at it again
    needs.answer("r0", GIB)
    await turns_until(lambda: tp not in core.consumer.paused)
    await core.intake.take(tp, [record])
    assert [job.request_id for job in core.scheduler.jobs.values()] == ["r0"]
    await core.scheduler.stop_jobs()


async def test_a_requests_models_are_read_at_once_within_one_deadline_and_then_known(
    settings: Settings, tmp_path: Path
) -> None:
    estimator = Estimator(settings, MemoryHistory.load(tmp_path / "memory.json"))
    estimator.DEADLINE_S = 0.2
    started: list[str] = []

    async def never_answers(model_id: str, revision: str | None, deadline: Deadline) -> Tensors:
        started.append(model_id)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    estimator.read = never_answers  # type: ignore[method-assign]
    dpo = request(method="dpo", dataset={"id": "tiny/preferences"}, ref_model={"id": "other/reference"})
    assert estimator.known(dpo) == (False, None)
    assert await estimator.need(dpo) is None  # one deadline for the request, not one a model
    assert started == ["tiny/qwen2-chat", "other/reference"]  # both read at once
    # The reads end at the same deadline, each in its own task: on a loaded machine they settle a turn after `need`
    # gives up (a loaded run of the suite here once asked before they had).
    await turns_until(lambda: estimator.known(dpo)[0])
    assert estimator.known(dpo) == (True, None)  # unknown for a while: the next offer of it has its answer at once


async def test_requests_of_one_model_share_its_read_and_later_ones_are_estimated_without_one(
    settings: Settings, tmp_path: Path
) -> None:
    estimator = Estimator(settings, MemoryHistory.load(tmp_path / "memory.json"))
    reads: list[str] = []
    headers_come = asyncio.Event()

    async def read(model_id: str, revision: str | None, deadline: Deadline) -> Tensors:
        reads.append(model_id)
        await headers_come.wait()
        return Tensors.from_headers([small_header()]).warm()

    estimator.read = read  # type: ignore[method-assign]
    first, second = (asyncio.create_task(estimator.need(request(request_id))) for request_id in ("a", "b"))
    await turns_until(lambda: bool(reads))
    headers_come.set()
    one, two = await first, await second
    assert reads == ["tiny/qwen2-chat"] and one is not None and one == two
    assert estimator.known(request("c")) == (True, one)  # by model and revision, from what was read


async def test_a_fifo_among_a_models_files_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    try:
        async with asyncio.timeout(30):  # a guard against a hang without the fix, not a measure of speed
            with pytest.raises(WeightsUnreadable, match="not a regular file"):
                await executors.run("headers", read_header, fifo)  # `open` alone would wait for a writer for ever
    finally:
        release(fifo)


@pytest.fixture
def fifo_models(tmp_path: Path) -> Iterator[list[Path]]:
    """Forty local models whose one file is a FIFO no one writes: more than any default executor's threads."""
    folders = []
    for index in range(40):
        folder = tmp_path / f"fifo-{index}"
        folder.mkdir()
        os.mkfifo(folder / "model.safetensors")
        folders.append(folder)
    yield folders
    for folder in folders:
        release(folder / "model.safetensors")


def release(fifo: Path) -> None:
    """A writer opens and closes the FIFO, so that a reader blocked in `open` (without the fix)
    returns, and the test fails instead of hanging the process."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader waits on it


async def test_model_files_that_never_answer_hold_no_thread_and_a_large_request_is_decoded_beside_them(
    settings: Settings,
    fifo_models: list[Path],
) -> None:
    estimator = Estimator(settings, MemoryHistory.load(settings.work_dir / "memory.json"))
    unknown = await asyncio.gather(*(estimator.need(request(model={"id": str(folder)})) for folder in fifo_models))
    assert unknown == [None] * len(fifo_models)
    big = sft_request("big", dataset={"rows": [{"messages": [{"role": "user", "content": "x" * 400}]}] * 200})
    value = json.dumps(big).encode()
    assert len(value) >= OFF_LOOP_BYTES  # decoded in a worker thread
    async with asyncio.timeout(60):  # a guard against a hang without the fix, not a measure of speed
        decoded = await decoded_request(FakeRecord("t", 0, 0, b"big", value), settings.max_message_bytes)
    assert isinstance(decoded, RequestBase) and decoded.request_id == "big"


async def test_hub_header_reads_that_do_not_answer_end_by_their_deadline_and_give_their_threads_back(
    hub: HubServer,
    settings: Settings,
    tmp_path: Path,
) -> None:
    host = settings.model_copy(update={"hub_endpoint": hub.endpoint})
    prefix = f"stalled-{uuid.uuid4().hex[:8]}"
    stalled = [f"{prefix}/model-{index}" for index in range(executors.THREADS["headers"])]
    for repo_id in [*stalled, f"{prefix}-prompt/model"]:
        hub.put_files(repo_id, {"model.safetensors": safetensors_header_only(small_header())})
    for repo_id in stalled:
        hub.slow_down("GET", f"^/{repo_id}/resolve/", 60)  # far past any deadline here
    estimator = Estimator(host, MemoryHistory.load(tmp_path / "memory.json"))
    estimator.DEADLINE_S = 2.0
    waits = await asyncio.gather(*(estimator.need(request(model={"id": repo_id})) for repo_id in stalled))
    assert waits == [None] * len(stalled)  # every header thread had a read that did not answer
    # A read that kept its thread would hold it for a minute: this one would wait past its deadline.
    found = await estimator.need(request(model={"id": f"{prefix}-prompt/model"}))
    assert found is not None and found.parts["weights"] == 2 * Tensors.from_headers([small_header()]).parameters


async def test_a_sharded_hub_model_is_read_from_its_index_and_every_shards_header(
    hub: HubServer, settings: Settings, tmp_path: Path
) -> None:
    prefix = f"sharded-{uuid.uuid4().hex[:8]}"
    hub.put_files(f"{prefix}/whole", {"model.safetensors": safetensors_header_only(small_header())})
    hub.put_files(f"{prefix}/sharded", sharded_safetensors(small_header(), 5))
    files = sharded_safetensors(small_header(), 2)
    files["model.safetensors.index.json"] = json.dumps({"weight_map": {"x": "../elsewhere.safetensors"}}).encode()
    hub.put_files(f"{prefix}/escaping", files)
    estimator = Estimator(
        settings.model_copy(update={"hub_endpoint": hub.endpoint}), MemoryHistory.load(tmp_path / "memory.json")
    )
    whole, sharded = [await estimator.need(request(model={"id": f"{prefix}/{name}"})) for name in ("whole", "sharded")]
    assert whole is not None and whole == sharded  # five shards' headers make the same model as one file's
    assert (
        len([path for method, path in hub.requests if path.startswith(f"/{prefix}/sharded/resolve/")]) == 1 + 1 + 5
    )  # probe, index, shards
    assert (
        await estimator.need(request(model={"id": f"{prefix}/escaping"})) is None
    )  # an index naming a file outside the repo
    assert await estimator.need(request(model={"id": f"{prefix}/missing"})) is None


@pytest.mark.parametrize(
    ("shape", "said"),
    [
        ([-1000, 64], "a negative dimension (-1000)"),
        ([10**3999, 64], "a dimension of a number of 4000 digits, beyond any GPU's memory"),
        ([2**30, 2**30], "1152921504606846976 values, beyond any GPU's memory"),
        ([True, 64], "not a whole number"),
        ([1000.0, 64], "not a whole number"),
        (["1000", 64], "not a whole number"),
        ([1] * 9, "at most 8 dimensions"),
        ([0, 64], "a token embedding of shape (0, 64)"),
    ],
)
def test_a_dimension_no_model_has_is_unreadable_weights_naming_the_tensor(shape: list[Any], said: str) -> None:
    with pytest.raises(WeightsUnreadable) as raised:
        Tensors.from_headers([small_header(**{"model.embed_tokens.weight": shape})]).warm()
    assert said in str(raised.value)
    assert "4000" in said or len(str(raised.value)) < 200  # a 4,000-digit number is said by its digits' count


def test_headers_of_no_weights_or_of_more_than_any_gpu_holds_are_unreadable() -> None:
    with pytest.raises(WeightsUnreadable, match="no tensor with any values"):
        Tensors.from_headers([{"a": {"dtype": "BF16", "shape": [0]}, "b": {"dtype": "F32", "shape": [4, 0]}}])
    with pytest.raises(WeightsUnreadable, match="parameters, beyond any GPU's memory"):
        Tensors.from_headers([{f"t{index}": {"dtype": "BF16", "shape": [2**47]} for index in range(3)}])


@pytest.mark.parametrize(("dimension", "what"), [(-151936, "negative"), (10**3999, "4,000 digits")])
async def test_a_model_with_an_absurd_dimension_runs_on_a_whole_gpu_never_on_a_negative_share_nor_internal(
    settings: Settings,
    tmp_path: Path,
    dimension: int,
    what: str,
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    header = small_header(**{"model.embed_tokens.weight": [dimension, 64]})
    (model / "model.safetensors").write_bytes(safetensors_header_only(header))
    core = CoreOnFakes(settings, children=FakeChildren(HANGS))
    offered: list[tuple[str, int]] = []
    for index in range(3):  # once three jobs of 60 GiB went onto one 80 GiB GPU on negative shares
        tp, record = record_on(core, f"r{index}", index, sft_request(f"r{index}", model={"id": str(model)}))
        await core.intake.take(tp, [record])
        pending = core.scheduler.estimates.pending.get(tp)
        if pending is not None:
            assert await pending.task is None, what  # unknown: its headers are unreadable
            await core.intake.take(tp, [record])
        offered.append((f"r{index}", len(core.scheduler.jobs)))
    assert offered == [("r0", 1), ("r1", 1), ("r2", 1)]  # the first on the whole GPU, the others held behind it
    [job] = core.scheduler.jobs.values()
    assert job.placement is not None and job.placement.share_bytes is None and job.runner.memory.estimate is None
    assert "rejected" not in core.types()  # never `internal`
    assert core.slots.take(1, -60 * GIB) is None  # and a negative need is never a share: it would be a whole GPU, taken
    await core.scheduler.stop_jobs()


def test_a_history_file_edited_to_say_infinity_scales_nothing(tmp_path: Path) -> None:
    (tmp_path / "memory.json").write_text('{"m|sft": [Infinity, -1, 1e308, 1.5]}')
    assert MemoryHistory.load(tmp_path / "memory.json").scale("m", "sft") == 1.5
