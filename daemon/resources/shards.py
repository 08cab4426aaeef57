"""A job's memory plan: whether its GPUs each hold a whole copy of its model (data-parallel) or a shard of it
(FSDP2 full-shard, `resources.shard: fsdp`), decided from its memory estimate before it starts, and the
rejection of a job that fits this host's GPUs neither way (issue 62).

The rule, with a whole GPU's memory for jobs known (`gpu_room`: `gpu_memory_bytes` or nvidia-smi, less
`gpu_memory_headroom`) and the job's estimate known:
- `resources.shard: auto` (the default): a whole copy when its estimate fits one GPU; else sharded across its
  `resources.gpus` when sharding is offered for the request (`RequestBase.sharding_problem`: SFT, DPO, KTO, reward
  and GRPO, no quantization) and one GPU's figure sharded fits; else rejected, with the numbers.
- `none` and `fsdp`: as asked, rejected with the numbers when the figure does not fit.
The request the job runs has its `shard` resolved ('none' or 'fsdp'): the child never sees 'auto'. With the
GPUs' memory or the estimate unknown, the request runs as it asked ('auto' as 'none'), as before this plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import structlog

from daemon.resources.memory import Estimate
from schemas import FieldError, Rejection, RequestBase
from schemas.common import AdapterdError

log = structlog.get_logger()

# resources.shard → the plan `accepted` names. 'auto' is resolved before a job starts (`planned`); a runner given a
# request as read (tests build them so) runs it as the child loads 'auto': a whole copy.
PLANS = {"none": "data-parallel", "fsdp": "sharded", "auto": "data-parallel"}


class Sharding(Protocol):
    """What the plan asks of the estimator (daemon/resources/estimator.py): one GPU's figure with the base sharded,
    from models read before (the whole copy's estimate read them)."""

    def known(
        self, request: RequestBase, *, gradient_checkpointing: bool = True, shards: int = 1
    ) -> tuple[bool, Estimate | None]: ...


class Unfit(AdapterdError):
    """A request whose job fits none of this host's GPUs as planned: intake rejects it (`rejection`) and reads on."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.errors[0].message)
        self.rejection = rejection


@dataclass(frozen=True)
class Planned:
    """The request as its job runs it (`resources.shard` resolved) and its estimate on each GPU under that plan."""

    request: RequestBase
    estimate: Estimate | None


def shards(request: RequestBase) -> int:
    """The GPUs a job's base is sharded across: its `resources.gpus` when sharded, else 1 (a whole copy each)."""
    return request.resources.gpus if request.resources.shard == "fsdp" else 1


def resolved(request: RequestBase, shard: str) -> RequestBase:
    """The request with `resources.shard` set to the plan's (the record's bytes are
    untouched: a retry is planned again)."""
    if request.resources.shard == shard:
        return request
    return request.model_copy(update={"resources": request.resources.model_copy(update={"shard": shard})})


def _gb(size: int) -> str:
    return f"{size / 1e9:.1f} GB"


def planned(
    request: RequestBase, whole: Estimate | None, estimator: Sharding, gpu_room: int | None, host_gpus: int
) -> Planned:
    """The job's plan (the module's rule) from its whole-copy estimate `whole`; raises Unfit when it fits neither way.
    `host_gpus`: the most GPUs a job can have here, for the rejection's hint."""
    asked, gpus = request.resources.shard, request.resources.gpus
    if whole is None or gpu_room is None:  # nothing to decide by: as asked, 'auto' as 'none'
        if asked == "fsdp":
            return Planned(resolved(request, "fsdp"), _sharded(request, estimator, gpus) if whole is not None else None)
        return Planned(resolved(request, "none"), whole)
    if asked != "fsdp" and whole.needed <= gpu_room:
        return Planned(resolved(request, "none"), whole)
    problem = (
        request.sharding_problem()
    )  # None where the child shards it (a request asking 'fsdp' has none: refused at decoding)
    sharded = _sharded(request, estimator, gpus) if gpus > 1 and asked != "none" and problem is None else None
    if sharded is not None and sharded.needed <= gpu_room:
        if asked == "auto":
            log.info(
                "job.sharded",
                request_id=request.request_id,
                gpus=gpus,
                whole_bytes=whole.needed,
                per_gpu_bytes=sharded.needed,
                gpu_room=gpu_room,
            )
        return Planned(resolved(request, "fsdp"), sharded)
    raise Unfit(_rejection(request, whole, sharded, estimator, gpu_room, host_gpus, problem))


def _sharded(request: RequestBase, estimator: Sharding, count: int) -> Estimate | None:
    return estimator.known(request, shards=count)[1]


def _rejection(
    request: RequestBase,
    whole: Estimate,
    sharded: Estimate | None,
    estimator: Sharding,
    gpu_room: int,
    host_gpus: int,
    problem: str | None,
) -> Rejection:
    """`rejected` naming resources.gpus (resources.shard for a 'none' that sharding would fit) with the numbers:
    what the job needs on each GPU, whole and sharded, against what this host's GPUs hold for jobs; and what
    would fit, where something would."""
    gpus, asked = request.resources.gpus, request.resources.shard
    message = f"its memory estimate is {_gb(whole.needed)} a GPU for a whole copy"
    if sharded is not None:
        message += f", {_gb(sharded.needed)} a GPU sharded across its {gpus} GPUs,"
    message += f" and this host's GPUs hold {_gb(gpu_room)} each for jobs"
    path = "resources.gpus"
    if problem is not None:
        if asked == "auto":
            message += f"; it cannot shard: {problem}"
    else:
        across = _sharded(request, estimator, gpus) if asked == "none" and gpus > 1 else None
        if across is not None and across.needed <= gpu_room:
            path = "resources.shard"
            message += (
                f"; sharded across its {gpus} GPUs it would need {_gb(across.needed)} a GPU: set shard 'fsdp' or 'auto'"
            )
        elif host_gpus > gpus:
            widest = _sharded(request, estimator, host_gpus)
            if widest is not None and widest.needed <= gpu_room:
                message += (
                    f"; sharded across this host's {host_gpus} GPUs it would need {_gb(widest.needed)} a GPU: ask for "
                    f"gpus {host_gpus} (shard 'auto' or 'fsdp')"
                )
    log.info(
        "job.does_not_fit",
        request_id=request.request_id,
        shard=asked,
        gpus=gpus,
        whole_bytes=whole.needed,
        sharded_bytes=sharded.needed if sharded is not None else None,
        gpu_room=gpu_room,
    )
    return Rejection("resources", [FieldError(path=path, message=message)], request.request_id)
