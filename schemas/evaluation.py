"""Judging an adapter before it is published: the request's `evaluation` block (what is measured, on
which baselines, and the gate that decides where the artifact goes), the numbers the child measures
(`EvaluationResult`, on the status pipe), and what the `succeeded` event reports of them
(`EvaluationReport`).

The child measures; the daemon judges (daemon/job/gate.py), from the child's numbers alone, so the
verdict of a job whose artifact is already on disk is the same on every attempt. A failed gate is
not a failed job: the request ends `succeeded` with `published` saying where the artifact went.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from .common import Frozen, branch_problem
from .dataset import SourceSpec
from .provenance import ResolvedSource
from .rewards import RewardFunction, RewardModelSpec

# A metric's name as TRL logs it (`eval_loss`, `eval_rewards/accuracies`): short, and nothing that
# could be mistaken for a path or markup when it lands in the model card.
METRIC_NAME = r"^[A-Za-z][A-Za-z0-9_./-]{0,127}$"
MAX_GATE_RULES = 32
# A task's name in an evaluation library's registry (lm-eval's `arc_easy`, `gsm8k`): a name, never a
# path (lm-eval's TaskManager would read a YAML file at a path given as a task name).
TASK_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
MAX_FEWSHOT = 32

Baseline = Literal["base", "current"]
# Where a judged artifact went, as the `succeeded` event says it (`Succeeded.published`).
Published = Literal["main", "pr", "branch", "none"]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class MethodSuite(Frozen):
    """The method's own measure on the request's eval set (`dataset.eval`, `dataset.eval_split` or
    `dataset.test_split_size`),
    by its TRL trainer's `evaluate()`: `eval_loss` (and for SFT `eval_perplexity`,
    `eval_mean_token_accuracy`), preference accuracy and margins (`eval_rewards/accuracies`,
    `eval_rewards/margins`) for DPO, KTO, ORPO and CPO, `eval_accuracy` for a reward model."""

    kind: Literal["method"] = "method"


class RewardsSuite(Frozen):
    """Generation scored by reward functions: each model answers every eval row's prompt (its
    `prompt`, or its `messages` up to the last assistant turn) once, greedily, and the shipped
    reward functions score the answers (the same functions GRPO's `rewards` names; a function's
    columns come from the eval rows), and/or a reward model. Reports `reward_mean` (the weighted sum, averaged),
    `reward_pass_rate` (the share of answers scoring at least `pass_threshold`) and
    `rewards/<function>/mean`; usable with every method, SFT included."""

    kind: Literal["rewards"]
    functions: list[RewardFunction] = Field(default_factory=list, max_length=16)
    model: RewardModelSpec | None = Field(
        None,
        description=(
            "A sequence-classification reward model (e.g. a reward request's output), under the host's model policy as "
            "the base is; its score of prompt and answer is `rewards/model/mean`, weighted into reward_mean."
        ),
    )
    max_new_tokens: int = Field(
        32, ge=1, description="The most tokens of each answer; bounded by the operator's max_new_tokens."
    )
    pass_threshold: FiniteFloat = Field(1.0, description="An answer passes when its weighted reward is at least this.")

    @field_validator("functions")
    @classmethod
    def _distinct(cls, value: list[RewardFunction]) -> list[RewardFunction]:
        if len({f.name for f in value}) != len(value):
            raise ValueError("each reward function once: its mean is reported by its name")
        return value

    @model_validator(mode="after")
    def _scored(self) -> RewardsSuite:
        if not self.functions and self.model is None:
            raise ValueError("give at least one reward function or a reward model")
        return self


class TaskSuite(Frozen):
    """A named task of EleutherAI's lm-evaluation-harness (`lm-eval`, the host's `lm-eval` extra):
    its prompts, answer choices, filters and metrics as the harness defines them, scored on rows from
    `source`, which come from the same sources and host policy as training data (rows with the
    task's own columns, e.g. ARC's `question`, `choices`, `answerKey`). The harness's own download of
    the task's dataset is never used, and a task is one of the operator's `allowed_evaluation_tasks`.
    Reports `task/<task>/<metric>` (`task/arc_easy/acc`; a filter other than `none` is appended:
    `task/gsm8k/exact_match/strict-match`) and each metric's standard error as `<metric>_stderr`."""

    kind: Literal["task"]
    library: Literal["lm-eval"] = Field("lm-eval", description="The evaluation library whose task this is.")
    task: str = Field(
        pattern=TASK_NAME,
        description="The task's name in the library's registry, e.g. arc_easy; one defined by its own YAML file.",
    )
    source: SourceSpec = Field(
        description="The task's rows, with the task's own columns; its `split` is the one scored."
    )
    num_fewshot: int = Field(
        0,
        ge=0,
        le=MAX_FEWSHOT,
        description="Examples put before each question, drawn from the same rows (never the row asked).",
    )
    limit: int | None = Field(
        None, ge=1, description="Score at most this many rows (the first ones); all of them when unset."
    )
    max_new_tokens: int = Field(
        256,
        ge=1,
        description=(
            "For a task that generates (output_type generate_until): the most tokens of each answer; bounded by "
            "the operator's max_new_tokens."
        ),
    )


# Kinds of suite, told apart by `kind`.
Suite = Annotated[MethodSuite | RewardsSuite | TaskSuite, Field(discriminator="kind")]
EVAL_SET_SUITES = (MethodSuite, RewardsSuite)  # the suites that read the request's eval set


def _method_only() -> list[Suite]:
    return [MethodSuite()]


class GateRule(Frozen):
    """One comparison the adapter must pass: its `metric` at most (or at least) a bound. The bound is
    the number itself, or, with `of`, that number times the baseline's value of the same metric
    (`{"metric": "eval_loss", "at_most": 1.05, "of": "base"}`: no more than 5% above the base
    model's loss). A rule on a baseline the job has none of (`current` on a repo without an adapter)
    is judged `skipped`, not failed. A metric the adapter did not produce, or one that is not finite,
    fails its rule, and so does a relative rule whose baseline value is zero or negative (a factor of
    a negative number would turn the rule around): bound a metric that can be negative, such as a
    mean reward, with an absolute number."""

    metric: str = Field(
        pattern=METRIC_NAME, description="The metric's name as the evaluation reports it, e.g. eval_loss."
    )
    at_most: FiniteFloat | None = Field(
        None, description="Pass when the metric is no greater than this (times the baseline's value with `of`)."
    )
    at_least: FiniteFloat | None = Field(
        None, description="Pass when the metric is no less than this (times the baseline's value with `of`)."
    )
    of: Baseline | None = Field(
        None,
        description="Compare with this baseline's value of the same metric: 'base' (the base model) or 'current' (the "
        "adapter now at the target revision).",
    )

    @model_validator(mode="after")
    def _one_bound(self) -> GateRule:
        if (self.at_most is None) == (self.at_least is None):
            raise ValueError("a gate rule has exactly one of 'at_most' and 'at_least'")
        return self


class EvaluationSpec(Frozen):
    """Evaluate the adapter after training, in the job's own child, on held-out rows; judge it by
    `gate`; publish it to `output.revision` when it passes, else where `on_fail` says."""

    suites: list[Suite] = Field(
        default_factory=_method_only,
        min_length=1,
        max_length=4,
        description="What is measured; the method's own measure by default.",
    )
    baselines: list[Baseline] = Field(
        ["base"],
        max_length=2,
        description=(
            "Also evaluated once per job on the same rows with the same settings: 'base' (the base model: a fresh "
            "LoRA adapter, zero at the start) and 'current' (the adapter at output.repo_id's output.revision, when "
            "there is one; its commit recorded)."
        ),
    )
    gate: list[GateRule] = Field(
        default_factory=list,
        max_length=MAX_GATE_RULES,
        description="Every rule must pass for the adapter to be published to output.revision.",
    )
    require_finite_losses: bool = Field(
        True, description="Fail the gate when any training loss the trainer logged is NaN or infinite."
    )
    on_fail: Literal["pr", "branch", "none"] = Field(
        "pr",
        description=(
            "Where an adapter that fails its gate goes: a pull request against main ('pr': on the Hub, "
            "or on a host's local sink the folder <name>#<request_id> beside main's), the branch `fail_branch`, "
            "or nowhere ('none': nothing is pushed; the artifact stays on the host)."
        ),
    )
    fail_branch: str | None = Field(
        None,
        max_length=255,
        description="The branch for on_fail 'branch' (git's rules for a branch name); created from "
        "the default branch if missing.",
    )

    @field_validator("baselines")
    @classmethod
    def _distinct(cls, value: list[Baseline]) -> list[Baseline]:
        if len(set(value)) != len(value):
            raise ValueError("each baseline once")
        return value

    @field_validator("suites")
    @classmethod
    def _each_task_once(cls, value: list[Suite]) -> list[Suite]:
        tasks = [suite.task for suite in value if isinstance(suite, TaskSuite)]
        if len(set(tasks)) != len(tasks):
            raise ValueError("each task once: its metrics are reported by its name")
        return value

    @field_validator("fail_branch")
    @classmethod
    def _branch(cls, value: str | None) -> str | None:
        problem = branch_problem(value) if value is not None else None
        if problem:
            raise ValueError(f"not a branch name: {problem}")
        return value

    @model_validator(mode="after")
    def _where_a_failure_goes(self) -> EvaluationSpec:
        if self.on_fail == "branch" and self.fail_branch is None:
            raise ValueError("fail_branch: on_fail 'branch' needs the branch to push to")
        if self.on_fail != "branch" and self.fail_branch is not None:
            raise ValueError(f"fail_branch: only read with on_fail 'branch', not '{self.on_fail}'")
        return self


class Scores(Frozen):
    """One model's numbers on the eval rows, as its trainer's `evaluate()` returned them."""

    # A diverged model's loss is NaN: it crosses the status pipe as the NaN constant, and the gate
    # judges it (a rule on a value that is not finite fails).
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    metrics: dict[str, float]
    revision: str | None = Field(None, description="The commit of the adapter evaluated, for the 'current' baseline.")


class EvaluationResult(Frozen):
    """What the child measured after training (part of its `result` message, kept in the journal)."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    adapter: Scores
    baselines: dict[Baseline, Scores] = Field(
        default_factory=dict, description="Each baseline the request asked for that the job had."
    )
    missing_baselines: dict[Baseline, str] = Field(
        default_factory=dict, description="A baseline asked for that the job had none of, and why."
    )
    rows: int | None = Field(
        description="How many eval-set rows each model was measured on; null for a streamed eval set, or with task "
        "suites only (their rows are theirs)."
    )
    nonfinite_losses: int = Field(0, description="How many logged training losses were NaN or infinite.")
    best_checkpoint_step: int | None = Field(
        None, description="With metric_for_best_model: the step of the best evaluated checkpoint, the one pushed."
    )
    task_sources: list[ResolvedSource] = Field(
        default_factory=list, description="What each task suite's rows resolved to (provenance)."
    )
    libraries: dict[str, str] = Field(
        default_factory=dict, description="The evaluation libraries the task suites ran on, with their versions."
    )


class RuleOutcome(Frozen):
    """One rule of the gate, judged: the adapter's value, the baseline's, the bound they made, and
    whether it passed (`skipped`: the baseline it names is one the job has none of)."""

    rule: str = Field(description="The rule as written, e.g. 'eval_loss at most 1.05 x base'.")
    metric: str
    value: float | None = Field(description="The adapter's value; null when it produced none or it was not finite.")
    baseline: float | None = Field(None, description="The baseline's value, for a rule with `of`.")
    bound: float | None = Field(description="What the value was compared with.")
    outcome: Literal["passed", "failed", "skipped"]
    reason: str | None = Field(None, description="Why it failed or was skipped.")


class EvaluationReport(Frozen):
    """The `evaluation` of a `succeeded` event: every number, each baseline's beside it, each rule's
    outcome and the verdict. A value that is not finite is null (JSON has no NaN)."""

    adapter: dict[str, float | None]
    baselines: dict[Baseline, dict[str, float | None]] = Field(default_factory=dict)
    baseline_revisions: dict[Baseline, str | None] = Field(
        default_factory=dict, description="The commit of the 'current' adapter evaluated."
    )
    missing_baselines: dict[Baseline, str] = Field(default_factory=dict)
    rows: int | None
    nonfinite_losses: int
    best_checkpoint_step: int | None = None
    task_sources: list[ResolvedSource] = Field(
        default_factory=list, description="What each task suite's rows resolved to."
    )
    libraries: dict[str, str] = Field(
        default_factory=dict,
        description="The evaluation libraries the task suites ran on, with their versions, e.g. {'lm-eval': '0.4.13'}.",
    )
    rules: list[RuleOutcome]
    verdict: Literal["pass", "fail"]
