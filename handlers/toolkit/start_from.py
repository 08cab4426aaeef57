"""Starting from what an earlier request published (`start_from`, issue 63; the daemon resolves it to a `StartPoint`
from that request's `succeeded` event, daemon/jobs/prerequisites.py).

The artifact is an adapter when it holds `adapter_config.json`, else a whole model (a merged push or a full
fine-tune). A whole model is the job's base: its folder replaces `model.id` when the base loads (`start_base`). An
adapter is loaded on the request's own base model as the adapter to train (`start_adapter`: PEFT's
`PeftModel.from_pretrained(..., is_trainable=True)`). Given such a PeftModel and no `ref_model`, TRL 1.16's DPO, KTO,
GRPO and RLOO trainers copy its adapter into a frozen one named `ref` and take that as the reference
(`use_adapter(model, "ref")`; the successor of the old `model_adapter_name`/`ref_adapter_name` fields, which 1.16 no
longer has): the reference is the starting adapter, not the bare base. The artifact then holds the trained adapter
alone (`saved_adapters`). The request's `peft` block is not applied: the adapter's own LoRA configuration is trained
on. A full fine-tune (`peft: null`) from an adapter merges it into the base first."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from handlers.protocol import JobFailed, JobSpec, StartPoint
from handlers.toolkit.loading import resolve_model
from schemas.request import RequestBase

if TYPE_CHECKING:
    from transformers import PreTrainedModel

REFERENCE_ADAPTER = "ref"  # the name TRL's trainers give their copy of a PeftModel's adapter, the reference


def start_folder(request: RequestBase, job: JobSpec) -> tuple[Path, str | None] | None:
    """The local folder of the artifact the job starts from and its commit, downloaded once (the Hub's cache), or
    None without a start."""
    start = job.start
    if start is None:
        return None
    if start.folder is not None:
        if not start.folder.is_dir():
            raise JobFailed(
                "prerequisite_failed",
                "load_model",
                f"start_from: {start.request_id}'s artifact folder {start.folder} is not on this host",
            )
        return start.folder, None
    spec = request.model.model_copy(update={"id": start.repo_id, "revision": start.commit_sha})
    path, revision = resolve_model(spec, "start_from", max_bytes=job.max_model_bytes)
    return Path(path), revision


def is_adapter(folder: Path) -> bool:
    return (folder / "adapter_config.json").is_file()


def start_base(request: RequestBase, job: JobSpec) -> tuple[str, str | None] | None:
    """The base model's folder and commit when the job starts from a whole model, else None (the request's own)."""
    found = start_folder(request, job)
    if found is None or is_adapter(found[0]):
        return None
    _say(job.start, found, "base model")
    return str(found[0]), found[1]


def start_adapter(model: PreTrainedModel, request: RequestBase, job: JobSpec, *, reference: bool) -> Any | None:
    """The policy to train when the job starts from an adapter: `model` with it loaded trainable (`reference`: the
    trainer makes its frozen copy the reference), or merged into it for a full fine-tune; None when the job starts from
    no adapter (the caller applies the request's `peft` as usual)."""
    from peft import PeftModel

    found = start_folder(request, job)
    if found is None or not is_adapter(found[0]):
        return None
    folder = str(found[0])
    try:
        policy = PeftModel.from_pretrained(model, folder, is_trainable=True)
        if request.peft is None:
            _say(job.start, found, "adapter, merged for a full fine-tune")
            return policy.merge_and_unload()
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise JobFailed(
            "model_unavailable",
            "load_model",
            f"start_from: the adapter {job.start.request_id if job.start else ''} published does not load on "
            f"model.id {request.model.id}: {exc}",
        ) from exc
    _say(job.start, found, "adapter, trainable" + (" and as the reference" if reference else ""))
    return policy


def saved_adapters(model: Any) -> dict[str, Any]:
    """What `save_pretrained` is given so the artifact holds the trained adapter alone, not the reference copy."""
    config = getattr(model, "peft_config", None)
    if isinstance(config, dict) and REFERENCE_ADAPTER in config:
        return {"selected_adapters": [name for name in config if name != REFERENCE_ADAPTER]}
    return {}


def _say(start: StartPoint | None, found: tuple[Path, str | None], what: str) -> None:
    """One line in the child's log: what the job starts from (the e2e test reads it there)."""
    if start is not None:
        where = f"{start.repo_id}@{found[1]}" if found[1] is not None else str(found[0])
        print(f"adapterd: start_from {start.request_id}: {where} ({what})", file=sys.stderr, flush=True)
