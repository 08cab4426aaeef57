"""Stage `evaluate`, in the job's own child after training: the request's `evaluation` measured on
the eval rows, for the trained adapter and for each baseline, with the same trainer and settings.

Each model is measured by the trainer's own `evaluate()` (the method's measure: loss, perplexity,
preference accuracy and margins, a reward model's accuracy, GRPO's and RLOO's rewards on held-out
prompts). A baseline is another LoRA adapter made active on the same model, so nothing is loaded
twice and the trainer's own reference handling (DPO and KTO disable the active adapter for their
reference) is the same for every model:

- `base`: a fresh adapter of the same LoRA config, whose B matrices start at zero: exactly the base
  model (PEFT's default initialisation);
- `current`: the adapter now at `output.repo_id`@`output.revision` on the Hub (or, on a host
  without one, in its local sink), when there is one.

The numbers go to the daemon, which judges them (daemon/job/gate.py); nothing here decides.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from peft import LoraConfig, PeftModel
from transformers import Trainer

from handlers.protocol import JobFailed, JobSpec
from handlers.toolkit.evaluation import task as evaluation_task
from handlers.toolkit.evaluation.rewards import RewardModel, score
from handlers.toolkit.evaluation.task import PreparedTask
from handlers.toolkit.reporting import StatusReporter
from handlers.toolkit.sources import AnyDataset, check_download_size
from schemas.evaluation import Baseline, EvaluationResult, RewardsSuite, Scores, TaskSuite
from schemas.request import RequestBase

# What `evaluate()` reports of its own running, not of the model.
_TIMINGS = frozenset({"epoch", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second"})
TRAINED = "default"  # the name PEFT gives the adapter a trainer trains
# LoRA initialisations that rewrite the base layer's weights (PEFT subtracts what the adapter starts
# with): after them the model holds a residual, not the base, so there is no base to measure.
BASE_CHANGING_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga")  # PEFT 0.21's, read in its lora/layer.py


def _measure(
    trainer: Trainer,
    request: RequestBase,
    eval_rows: AnyDataset | None,
    reporter: StatusReporter,
    who: Literal["adapter", "base", "current"],
    reward_models: dict[int, RewardModel],
    tasks: dict[int, PreparedTask],
) -> dict[str, float]:
    """The active model's numbers, suite by suite."""
    assert request.evaluation is not None
    reporter.evaluating = who  # its progress reports name the model measured
    metrics: dict[str, float] = {}
    assert trainer.processing_class is not None
    # a processor's own tokenizer; a tokenizer has none and is its own
    tokenizer: Any = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    for index, suite in enumerate(request.evaluation.suites):
        if isinstance(suite, RewardsSuite):
            assert eval_rows is not None  # the request's schema requires an eval set
            metrics.update(
                score(
                    trainer.model, tokenizer, eval_rows, suite, f"evaluation.suites.{index}", reward_models.get(index)
                )
            )
            continue
        if isinstance(suite, TaskSuite):
            metrics.update(
                evaluation_task.score(trainer.model, tokenizer, tasks[index], trainer.args.per_device_eval_batch_size)
            )
            continue
        metrics.update(
            {k: float(v) for k, v in trainer.evaluate().items() if isinstance(v, int | float) and k not in _TIMINGS}
        )
        if request.method == "sft" and "eval_loss" in metrics:
            # Perplexity of the eval rows' completion tokens; a diverged loss is +inf, not an error.
            metrics["eval_perplexity"] = math.exp(metrics["eval_loss"]) if metrics["eval_loss"] < 700 else math.inf
    return metrics


@contextmanager
def _active(model: PeftModel, name: str) -> Iterator[None]:
    """Make the adapter `name` the active one for the block, then the trained one again, and drop
    `name` so that nothing of it is left on the model."""
    model.set_adapter(name)
    try:
        yield
    finally:
        model.set_adapter(TRAINED)
        model.delete_adapter(name)


def _current_adapter(request: RequestBase, job: JobSpec) -> tuple[str, str | None] | str:
    """The local folder and commit of the adapter at the request's target revision, or why there is
    none. On a host without a Hub, the local sink's folder the daemon named (no commit), if any."""
    output = request.output
    if not job.hub:
        if job.local_current_adapter is None:
            return f"the local sink holds no adapter for {output.repo_id}@{output.revision}"
        return str(job.local_current_adapter), None
    try:
        info = HfApi().model_info(output.repo_id, revision=output.revision, files_metadata=True)
    except (RepositoryNotFoundError, RevisionNotFoundError):
        return f"{output.repo_id}@{output.revision} does not exist yet"
    except HfHubHTTPError as exc:
        raise JobFailed(
            "model_unavailable",
            "evaluate",
            f"evaluation.baselines: cannot read {output.repo_id}@{output.revision}: {exc!r}",
            retryable=True,
        ) from exc
    files = {s.rfilename for s in info.siblings or []}
    if "adapter_config.json" not in files:
        return f"{output.repo_id}@{output.revision} holds no LoRA adapter (no adapter_config.json)"
    check_download_size(
        "evaluation.baselines",
        output.repo_id,
        [s.size for s in info.siblings or []],
        job.max_model_bytes,
        "max_model_bytes",
    )
    assert info.sha is not None
    return snapshot_download(output.repo_id, revision=info.sha), info.sha


def evaluate(
    trainer: Trainer, request: RequestBase, job: JobSpec, reporter: StatusReporter, eval_rows: AnyDataset | None
) -> EvaluationResult | None:
    """The request's evaluation after training (None without one): every baseline first, then the
    trained adapter, so the trainer's last logged evaluation is the adapter's. `eval_rows`: the eval
    set as loaded (the rewards suite reads its prompts and columns; the trainer has its own copy, tokenized)."""
    spec = request.evaluation
    if spec is None:
        return None
    reporter.enter("evaluate")
    reward_models = {  # loaded once, for every model measured
        index: RewardModel(suite.model, f"evaluation.suites.{index}", job.max_model_bytes)
        for index, suite in enumerate(spec.suites)
        if isinstance(suite, RewardsSuite) and suite.model is not None
    }
    tasks = {  # rows read and the task file written once, for every model measured
        index: evaluation_task.prepare(
            suite, f"evaluation.suites.{index}", job, job.checkpoints.parent / "evaluation_tasks" / str(index)
        )
        for index, suite in enumerate(spec.suites)
        if isinstance(suite, TaskSuite)
    }
    model: Any = trainer.model
    baselines: dict[Baseline, Scores] = {}
    missing: dict[Baseline, str] = {}
    for baseline in spec.baselines:
        if not isinstance(model, PeftModel):
            missing[baseline] = "a full fine-tune has no adapter to set aside"
            continue
        if baseline == "base":
            trained_config = model.peft_config[TRAINED]
            assert isinstance(trained_config, LoraConfig)  # handlers train LoRA adapters only
            trained_init = trained_config.init_lora_weights
            if isinstance(trained_init, str) and trained_init.startswith(BASE_CHANGING_INITS):
                missing["base"] = (
                    f"init_lora_weights '{trained_init}' changed the base weights when the adapter was made: the "
                    "base is not on the model any more"
                )
                continue
            fresh = copy.deepcopy(trained_config)
            fresh.init_lora_weights = True  # PEFT's default: B = 0, the base weights untouched
            model.add_adapter("base", fresh)
            with _active(model, "base"):
                baselines["base"] = Scores(
                    metrics=_measure(trainer, request, eval_rows, reporter, "base", reward_models, tasks)
                )
            continue
        found = _current_adapter(request, job)
        if isinstance(found, str):
            missing["current"] = found
            continue
        path, sha = found
        try:
            model.load_adapter(path, adapter_name="current")
        except (RuntimeError, ValueError, KeyError, OSError) as exc:  # another base's shapes, a broken file
            missing["current"] = (
                f"the adapter at {request.output.repo_id}@{request.output.revision} does "
                f"not load onto this base: {exc}"[:500]
            )
            continue
        with _active(model, "current"):
            baselines["current"] = Scores(
                metrics=_measure(trainer, request, eval_rows, reporter, "current", reward_models, tasks), revision=sha
            )
    adapter = Scores(metrics=_measure(trainer, request, eval_rows, reporter, "adapter", reward_models, tasks))
    reporter.evaluating = None
    training_losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    best = trainer.state.best_model_checkpoint if trainer.args.load_best_model_at_end else None
    rows = trainer.eval_dataset if trainer.eval_dataset is not None else eval_rows
    return EvaluationResult(
        adapter=adapter,
        baselines=baselines,
        missing_baselines=missing,
        rows=len(rows) if hasattr(rows, "__len__") else None,  # type: ignore[arg-type]  # a stream has no length
        nonfinite_losses=sum(1 for loss in training_losses if not math.isfinite(loss)),
        best_checkpoint_step=int(best.rsplit("-", 1)[-1]) if best else None,
        task_sources=[prepared.source for prepared in tasks.values()],
        libraries={evaluation_task.LIBRARY: evaluation_task.library_version()} if tasks else {},
    )
