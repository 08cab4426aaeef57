"""The gate: the request's rules judged against the child's numbers, and where the artifact goes.

Pure functions of the request and the `EvaluationResult` in the job's journal, so a job whose
artifact is already on disk is judged the same on every attempt. A failed gate is not a failed job:
the job still ends `succeeded`, published to a pull request, a side branch or nowhere
(`Destination`), and is never retried.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from schemas.evaluation import EvaluationReport, EvaluationResult, EvaluationSpec, GateRule, Published, RuleOutcome
from schemas.request import RequestBase


@dataclass(frozen=True)
class Destination:
    """Where a judged artifact is published: `published` as the event says it, and the branch a
    commit goes to (for a pull request, the branch it is opened against)."""

    published: Published
    branch: str


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _rule_text(rule: GateRule) -> str:
    bound, value = ("at most", rule.at_most) if rule.at_most is not None else ("at least", rule.at_least)
    return f"{rule.metric} {bound} {value:g}" + (f" x {rule.of}" if rule.of is not None else "")


def judge_rule(rule: GateRule, result: EvaluationResult) -> RuleOutcome:
    text = _rule_text(rule)
    raw = result.adapter.metrics.get(rule.metric)
    value = _finite(raw)
    limit = rule.at_most if rule.at_most is not None else rule.at_least
    assert limit is not None  # GateRule holds exactly one bound
    baseline: float | None = None
    if rule.of is not None:
        scores = result.baselines.get(rule.of)
        if scores is None:
            why = result.missing_baselines.get(rule.of, "not evaluated")
            return RuleOutcome(
                rule=text,
                metric=rule.metric,
                value=value,
                bound=None,
                outcome="skipped",
                reason=f"no {rule.of} baseline: {why}",
            )
        baseline = _finite(scores.metrics.get(rule.metric))
        if baseline is None:
            return RuleOutcome(
                rule=text,
                metric=rule.metric,
                value=value,
                bound=None,
                outcome="failed",
                reason=f"the {rule.of} baseline has no finite {rule.metric}",
            )
        if baseline <= 0:
            # A factor of a negative number turns the rule around (at_least 1.05 x -2 is -2.1, a looser
            # bound, not a 5% gain), and of zero says nothing; judge it failed rather than guess.
            return RuleOutcome(
                rule=text,
                metric=rule.metric,
                value=value,
                baseline=baseline,
                bound=None,
                outcome="failed",
                reason=f"the {rule.of} baseline's {rule.metric} is {baseline:g}: a relative bound needs a positive "
                "baseline; use an absolute bound",
            )
        limit *= baseline
    if raw is None:
        return RuleOutcome(
            rule=text,
            metric=rule.metric,
            value=None,
            baseline=baseline,
            bound=limit,
            outcome="failed",
            reason=f"the evaluation reported no {rule.metric} (it reported "
            f"{', '.join(sorted(result.adapter.metrics)) or 'nothing'})",
        )
    if value is None:
        return RuleOutcome(
            rule=text,
            metric=rule.metric,
            value=None,
            baseline=baseline,
            bound=limit,
            outcome="failed",
            reason=f"{rule.metric} is {raw}",
        )
    passed = value <= limit if rule.at_most is not None else value >= limit
    return RuleOutcome(
        rule=text,
        metric=rule.metric,
        value=value,
        baseline=baseline,
        bound=limit,
        outcome="passed" if passed else "failed",
        reason=None
        if passed
        else f"{rule.metric} {value:g} is {'above' if rule.at_most is not None else 'below'} {limit:g}",
    )


def judge(spec: EvaluationSpec, result: EvaluationResult) -> EvaluationReport:
    """Every rule's outcome and the verdict: pass when no rule failed (and, when the request asks,
    every logged training loss was finite)."""
    outcomes = [judge_rule(rule, result) for rule in spec.gate]
    if spec.require_finite_losses:
        bad = result.nonfinite_losses
        outcomes.append(
            RuleOutcome(
                rule="every logged training loss finite",
                metric="loss",
                value=None,
                bound=None,
                outcome="failed" if bad else "passed",
                reason=f"{bad} logged losses were NaN or infinite" if bad else None,
            )
        )
    return EvaluationReport(
        adapter={name: _finite(value) for name, value in result.adapter.metrics.items()},
        baselines={
            name: {k: _finite(v) for k, v in scores.metrics.items()} for name, scores in result.baselines.items()
        },
        baseline_revisions={
            name: scores.revision for name, scores in result.baselines.items() if scores.revision is not None
        },
        missing_baselines=dict(result.missing_baselines),
        rows=result.rows,
        nonfinite_losses=result.nonfinite_losses,
        best_checkpoint_step=result.best_checkpoint_step,
        task_sources=list(result.task_sources),
        libraries=dict(result.libraries),
        rules=outcomes,
        verdict="fail" if any(o.outcome == "failed" for o in outcomes) else "pass",
    )


def destination(request: RequestBase, report: EvaluationReport | None) -> Destination:
    """Where the artifact goes: the requested revision without a gate or when it passed; else
    where the request's `on_fail` says."""
    evaluation = request.evaluation
    if report is None or evaluation is None or report.verdict == "pass":
        return Destination("main", request.output.revision)
    if evaluation.on_fail == "branch":
        assert evaluation.fail_branch is not None  # EvaluationSpec requires it
        return Destination("branch", evaluation.fail_branch)
    return Destination(evaluation.on_fail, request.output.revision)
