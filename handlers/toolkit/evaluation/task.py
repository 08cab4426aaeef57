"""The `task` suite of a request's evaluation: a named task of EleutherAI's lm-evaluation-harness,
scored on the request's own rows.

The harness defines the task (prompts, answer choices, filters, metrics); adapterd gives it the rows.
They are read like any dataset source (handlers/toolkit/sources.py: the host's policy, its size bounds) and
written as JSON Lines into the job's folder, beside a task file that includes the harness's own
YAML and replaces only where its data comes from. So the harness never downloads the task's
dataset, and a task is found by its name in the installed harness, never by a path.

Prepared once per job (`prepare`); `score` then runs it for each model the evaluation measures (the
adapter active on the model, or a baseline's), with the same rows, few-shot examples and seeds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import yaml
from transformers import PreTrainedTokenizerBase

from handlers.protocol import JobFailed, JobSpec
from handlers.toolkit.sources import load_source
from schemas.evaluation import TaskSuite
from schemas.provenance import ResolvedSource

LIBRARY = "lm-eval"
SEED = 1234  # lm-eval's own default seeds, fixed here so that every model sees the same few-shot examples
SPLIT = "test"  # the split name the task file gives the rows


@dataclass(frozen=True)
class PreparedTask:
    """A task suite ready to score: the harness's task manager over the job's own task file."""

    suite: TaskSuite
    field: str
    manager: Any  # lm_eval.tasks.TaskManager
    source: ResolvedSource
    rows: int


def library_version() -> str:
    return version(LIBRARY)


def _task_yaml(name: str, field: str) -> Path:
    """The harness's YAML file that defines task `name` as a task of its own (not a group or a tag).

    The harness's full index parses every one of its ~15,000 YAML files (about 10 s); the files that
    say `task: <name>` are found by their text first, and only their folder is indexed."""
    from lm_eval import tasks
    from lm_eval.tasks import TaskManager

    root = Path(tasks.__file__).parent
    says = re.compile(rf"^task:\s*['\"]?{re.escape(name)}['\"]?\s*$", re.MULTILINE)
    for folder in sorted(
        {path.parent for path in root.rglob("*.yaml") if says.search(path.read_text(errors="replace"))}
    ):
        manager = TaskManager(include_defaults=False, include_path=str(folder))
        entry = manager.task_index.get(name)
        if entry is not None and name in manager.all_subtasks and entry.yaml_path is not None:
            return Path(entry.yaml_path)
    raise JobFailed(
        "config_invalid",
        "evaluate",
        f"{field}.task: lm-eval {library_version()} has no task {name!r} defined by its own YAML file",
    )


def prepare(suite: TaskSuite, field: str, job: JobSpec, folder: Path) -> PreparedTask:
    """Read the suite's rows, write them and the task file into `folder`, and index that file."""
    from lm_eval.tasks import TaskManager

    included = _task_yaml(suite.task, field)
    rows, resolved = load_source(
        suite.source, suite.source.split, "eval", job, streaming=False, field=f"{field}.source"
    )
    if suite.source.columns:
        rows = rows.rename_columns(dict(suite.source.columns))
    if len(rows) == 0:
        raise JobFailed("dataset_invalid", "evaluate", f"{field}.source: no rows to score")
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "rows.jsonl"
    rows.to_json(str(data), lines=True)
    task = {
        "include": str(included),  # the harness's prompts, choices, filters and metrics
        "task": suite.task,
        # ...and only where the rows come from replaced: the JSON Lines file just written, as the
        # split scored (and the one few-shot examples are drawn from, the row asked left out).
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {SPLIT: str(data)}},
        "custom_dataset": None,
        "training_split": None,
        "validation_split": None,
        "test_split": SPLIT,
        "fewshot_split": SPLIT,
    }
    (folder / "task.yaml").write_text(yaml.safe_dump(task))
    manager = TaskManager(include_defaults=False, include_path=str(folder))
    return PreparedTask(suite=suite, field=field, manager=manager, source=resolved, rows=len(rows))


def metric_name(task: str, key: str) -> str | None:
    """lm-eval's `acc,none` as `task/<task>/acc`; a filter other than `none` appended
    (`exact_match,strict-match`: `task/gsm8k/exact_match/strict-match`). None for its bookkeeping."""
    if "," not in key:
        return None  # alias, name, sample_len
    metric, filter_name = key.split(",", 1)
    return f"task/{task}/{metric}" + ("" if filter_name == "none" else f"/{filter_name}")


def score(model: Any, tokenizer: PreTrainedTokenizerBase, prepared: PreparedTask, batch_size: int) -> dict[str, float]:
    """The active model's numbers on the task, as lm-eval computes them."""
    from jinja2 import TemplateError  # the harness renders a task's prompts with Jinja
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    suite = prepared.suite
    # HFLM takes a model already built (ours, adapter active); it then ignores its loading options.
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    try:
        output = simple_evaluate(
            model=lm,
            tasks=[suite.task],
            task_manager=prepared.manager,
            num_fewshot=suite.num_fewshot,
            limit=suite.limit,
            gen_kwargs={"max_gen_toks": suite.max_new_tokens},
            log_samples=False,
            bootstrap_iters=1000,
            random_seed=SEED,
            numpy_random_seed=SEED,
            torch_random_seed=SEED,
            fewshot_random_seed=SEED,
            confirm_run_unsafe_code=False,  # a task that would execute the model's output stays refused
        )
    except (
        KeyError,
        TypeError,
        ValueError,
        IndexError,
        AttributeError,
        TemplateError,
    ) as exc:  # the rows do not fit the task
        raise JobFailed(
            "dataset_invalid",
            "evaluate",
            f"{prepared.field}.source: lm-eval's {suite.task} cannot score these rows: {exc!r}"[:1000],
        ) from exc
    assert output is not None  # one process: rank 0 gets the results
    found = output["results"].get(suite.task, {})
    metrics: dict[str, float] = {}
    for key, value in found.items():
        name = metric_name(suite.task, key)
        if name is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue  # "N/A": a standard error lm-eval could not compute
        metrics[name] = float(value) if math.isfinite(value) else math.nan
    if not metrics:
        raise JobFailed(
            "dataset_invalid", "evaluate", f"{prepared.field}: lm-eval's {suite.task} reported no metric for these rows"
        )
    return metrics
