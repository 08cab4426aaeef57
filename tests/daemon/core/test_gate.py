"""The gate (daemon/job/gate.py) and the `evaluation` block's own rules (schemas/evaluation.py), in
process: each rule judged against the child's numbers, the verdict, where it sends the artifact,
and the requests the block refuses, each naming its field."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from daemon.admission.policy import policy_errors
from daemon.job.gate import destination, judge
from daemon.job.lifecycle import State
from daemon.jobs.offered import Offered
from daemon.settings import Settings
from handlers.protocol import StageEntered, TrainResult
from schemas import decode_request
from schemas.evaluation import EvaluationResult, EvaluationSpec, Scores
from schemas.request import RequestBase
from tests.core import CoreOnFakes
from tests.fakes import FakeChildren, Script
from tests.helpers import sft_request

EVAL_SET = {"id": "adapterd-test/chat-eval"}


def result(
    adapter: dict[str, float], base: dict[str, float] | None = None, current: dict[str, float] | None = None, **kw: Any
) -> EvaluationResult:
    baselines = {
        name: Scores(metrics=m, revision="c" * 40 if name == "current" else None)
        for name, m in (("base", base), ("current", current))
        if m is not None
    }
    return EvaluationResult(adapter=Scores(metrics=adapter), baselines=baselines, rows=4, **kw)


def spec(*rules: dict[str, Any], **kw: Any) -> EvaluationSpec:
    return EvaluationSpec.model_validate({"gate": list(rules), **kw})


def decided(**evaluation: Any) -> RequestBase | Any:
    document = sft_request("gated", dataset={"id": "adapterd-test/chat", "eval": EVAL_SET}, evaluation=evaluation)
    return decode_request(json.dumps(document).encode())


def test_a_rule_relative_to_the_base_passes_within_its_factor_and_fails_beyond_it() -> None:
    rule = {"metric": "eval_loss", "at_most": 1.05, "of": "base"}
    passed = judge(spec(rule), result({"eval_loss": 2.0}, base={"eval_loss": 2.0}))
    assert passed.verdict == "pass"
    assert (
        passed.rules[0].outcome == "passed"
        and passed.rules[0].bound == pytest.approx(2.1)
        and passed.rules[0].baseline == 2.0
    )
    failed = judge(spec(rule), result({"eval_loss": 2.2}, base={"eval_loss": 2.0}))
    assert failed.verdict == "fail"
    assert failed.rules[0].outcome == "failed" and "above 2.1" in str(failed.rules[0].reason)
    assert failed.baselines == {"base": {"eval_loss": 2.0}} and failed.adapter == {"eval_loss": 2.2}


def test_absolute_bounds_both_ways() -> None:
    report = judge(
        spec({"metric": "eval_loss", "at_most": 3}, {"metric": "eval_rewards/accuracies", "at_least": 0.6}),
        result({"eval_loss": 2.5, "eval_rewards/accuracies": 0.5}),
    )
    assert [r.outcome for r in report.rules] == ["passed", "failed", "passed"]  # the last: every loss finite
    assert report.verdict == "fail"


def test_a_diverged_adapter_fails_on_its_nan_loss_and_on_its_nan_training_losses() -> None:
    report = judge(
        spec({"metric": "eval_loss", "at_most": 1.05, "of": "base"}),
        result({"eval_loss": math.nan}, base={"eval_loss": 2.0}, nonfinite_losses=3),
    )
    assert report.verdict == "fail"
    assert (
        report.rules[0].outcome == "failed" and report.rules[0].value is None and "nan" in str(report.rules[0].reason)
    )
    assert report.rules[1].rule == "every logged training loss finite" and report.rules[1].outcome == "failed"
    assert report.adapter == {"eval_loss": None}  # JSON has no NaN: the event says null
    # Without the finite-losses rule, only the NaN eval_loss fails it.
    lax = judge(spec(require_finite_losses=False), result({"eval_loss": 1.0}, nonfinite_losses=3))
    assert lax.verdict == "pass" and lax.rules == []


def test_a_metric_the_evaluation_did_not_report_fails_naming_what_it_did_report() -> None:
    report = judge(spec({"metric": "eval_acc", "at_least": 0.5}), result({"eval_loss": 1.0}))
    assert report.rules[0].outcome == "failed" and "reported eval_loss" in str(report.rules[0].reason)


def test_a_rule_on_a_baseline_the_job_has_none_of_is_skipped_not_failed() -> None:
    evaluation = spec({"metric": "eval_loss", "at_most": 1.0, "of": "current"}, baselines=["base", "current"])
    missing = EvaluationResult(
        adapter=Scores(metrics={"eval_loss": 1.0}),
        missing_baselines={"current": "results/x@main does not exist yet"},
        rows=4,
    )
    report = judge(evaluation, missing)
    assert report.rules[0].outcome == "skipped" and "does not exist yet" in str(report.rules[0].reason)
    assert report.verdict == "pass" and report.missing_baselines == {"current": "results/x@main does not exist yet"}
    against = judge(evaluation, result({"eval_loss": 1.5}, current={"eval_loss": 1.2}))
    assert against.rules[0].outcome == "failed" and against.baseline_revisions == {"current": "c" * 40}


def test_a_relative_rule_on_a_baseline_of_zero_or_below_fails_rather_than_turn_around() -> None:
    # 1.05 x a mean reward of -2 is -2.1: a looser bound than the base, not a 5% gain over it.
    rule = {"metric": "eval_reward", "at_least": 1.05, "of": "base"}
    for base in (-2.0, 0.0):
        report = judge(spec(rule), result({"eval_reward": -2.05}, base={"eval_reward": base}))
        assert report.verdict == "fail" and report.rules[0].outcome == "failed" and report.rules[0].bound is None
        assert "needs a positive baseline" in str(report.rules[0].reason) and report.rules[0].baseline == base
    assert judge(spec({"metric": "eval_reward", "at_least": -2.0}), result({"eval_reward": -1.9})).verdict == "pass"


def test_where_the_artifact_goes() -> None:
    passing, failing = (
        judge(spec(), result({"eval_loss": 1.0})),
        judge(spec(), result({"eval_loss": 1.0}, nonfinite_losses=1)),
    )
    gated = decided(on_fail="pr")
    assert isinstance(gated, RequestBase)
    assert destination(gated, passing).published == "main" and destination(gated, passing).branch == "main"
    assert (destination(gated, failing).published, destination(gated, failing).branch) == ("pr", "main")
    side = decided(on_fail="branch", fail_branch="rejected/adapters")
    assert isinstance(side, RequestBase)
    assert (destination(side, failing).published, destination(side, failing).branch) == ("branch", "rejected/adapters")
    nowhere = decided(on_fail="none")
    assert isinstance(nowhere, RequestBase) and destination(nowhere, failing).published == "none"
    assert destination(nowhere, None).published == "main"  # no evaluation: as trained


@pytest.mark.parametrize(
    ("evaluation", "dataset", "output", "path", "words"),
    [
        (
            {"gate": [{"metric": "eval_loss"}]},
            None,
            None,
            "evaluation.gate.0",
            "exactly one of 'at_most' and 'at_least'",
        ),
        (
            {"gate": [{"metric": "eval_loss", "at_most": 1, "at_least": 0}]},
            None,
            None,
            "evaluation.gate.0",
            "exactly one",
        ),
        ({"gate": [{"metric": "<script>", "at_most": 1}]}, None, None, "evaluation.gate.0.metric", "pattern"),
        ({"gate": [{"metric": "eval_loss", "at_most": 1e400}]}, None, None, "evaluation.gate.0.at_most", "finite"),
        ({"gate": [{"metric": "eval_loss", "at_most": 1}] * 33}, None, None, "evaluation.gate", "at most 32"),
        ({"on_fail": "branch"}, None, None, "evaluation", "fail_branch: on_fail 'branch' needs"),
        ({"on_fail": "branch", "fail_branch": "../x"}, None, None, "evaluation.fail_branch", "not a branch name"),
        ({"on_fail": "none", "fail_branch": "x"}, None, None, "evaluation", "only read with on_fail 'branch'"),
        ({"baselines": ["base", "base"]}, None, None, "evaluation.baselines", "each baseline once"),
        ({"suites": [{"kind": "lm_eval"}]}, None, None, "evaluation.suites.0", "kind"),
        (
            {},
            {"id": "adapterd-test/chat"},
            None,
            "evaluation.suites",
            "set dataset.eval, dataset.eval_split or dataset.test_split_size",
        ),
        (
            {"on_fail": "pr"},
            None,
            {"repo_id": "results/x", "revision": "dev"},
            "evaluation.on_fail",
            "use on_fail 'branch'",
        ),
        (
            {"gate": [{"metric": "eval_loss", "at_most": 1, "of": "current"}]},
            None,
            None,
            "evaluation.gate[0].of",
            "not among evaluation.baselines",
        ),
        (
            {"on_fail": "branch", "fail_branch": "main"},
            None,
            None,
            "evaluation.fail_branch",
            "must differ from output.revision",
        ),
        ({"require_finite_losses": True}, "nan-filter", None, "training.logging_nan_inf_filter", "looks for"),
        # A task is a name in the library's registry, never a path to a task file.
        (
            {"suites": [{"kind": "task", "task": "../../etc/passwd", "source": {"rows": [{"q": 1}]}}]},
            None,
            None,
            "evaluation.suites.0.task",
            "should match pattern",
        ),
        (
            {"suites": [{"kind": "task", "task": "/tmp/evil.yaml", "source": {"rows": [{"q": 1}]}}]},
            None,
            None,
            "evaluation.suites.0.task",
            "should match pattern",
        ),
        (
            {"suites": [{"kind": "task", "task": "arc_easy", "source": {"url": "/data/../etc/x.jsonl"}}]},
            None,
            None,
            "evaluation.suites.0.source",
            "may not contain '..'",
        ),
        (
            {"suites": [{"kind": "task", "task": "arc_easy", "source": {"rows": [{"q": 1}]}}] * 2},
            None,
            None,
            "evaluation.suites",
            "each task once",
        ),
        (
            {"suites": [{"kind": "task", "task": "arc_easy", "source": {"rows": [{"q": 1}]}, "num_fewshot": 1000}]},
            None,
            None,
            "evaluation.suites.0.num_fewshot",
            "less than or equal to 32",
        ),
        (
            {"suites": [{"kind": "task", "task": "arc_easy", "source": {"rows": [{"q": 1}]}}, {"kind": "method"}]},
            {"id": "adapterd-test/chat"},
            None,
            "evaluation.suites.1",
            "a 'method' suite runs on the eval set",
        ),
    ],
)
def test_an_evaluation_block_that_cannot_work_is_rejected_naming_its_field(
    evaluation: dict[str, Any],
    dataset: dict[str, Any] | str | None,
    output: dict[str, Any] | None,
    path: str,
    words: str,
) -> None:
    filtered = dataset == "nan-filter"  # the request keeps transformers' NaN filter on
    document = sft_request(
        "gated",
        dataset={"id": "adapterd-test/chat", "eval": EVAL_SET} if dataset in (None, "nan-filter") else dataset,
        evaluation=evaluation,
    )
    if filtered:
        document["training"] = {**document["training"], "logging_nan_inf_filter": True}
    if output is not None:
        document["output"] = output
    rejection = decode_request(json.dumps(document).encode())
    assert not isinstance(rejection, RequestBase)
    text = " | ".join(f"{e.path}: {e.message}" for e in rejection.errors)
    assert path in text and words in text, text


def test_a_full_fine_tune_has_no_adapter_to_compare_with_the_base() -> None:
    document = sft_request("full", dataset={"id": "adapterd-test/chat", "eval": EVAL_SET}, peft=None, evaluation={})
    rejection = decode_request(json.dumps(document).encode())
    assert not isinstance(rejection, RequestBase)
    assert "a full fine-tune (peft: null) has none" in rejection.errors[0].message
    allowed = sft_request(
        "full", dataset={"id": "adapterd-test/chat", "eval": EVAL_SET}, peft=None, evaluation={"baselines": []}
    )
    assert isinstance(decode_request(json.dumps(allowed).encode()), RequestBase)


# The gate in a job's lifecycle, on the fakes (tests/core.py): a scripted child reports its
# evaluation, and the daemon judges it and publishes where the verdict says, on the local sink.


def scripted(evaluation: EvaluationResult | None) -> FakeChildren:
    train = TrainResult(
        trainer="trl.SFTTrainer/trl.SFTConfig",
        metrics={"train_loss": 1.5},
        base_model_revision=None,
        dataset_fingerprint="f",
        durations_s={"train": 0.1, "evaluate": 0.1},
        versions={},
        evaluation=evaluation,
    )
    return FakeChildren(
        Script(
            messages=[StageEntered(stage="train"), StageEntered(stage="save"), StageEntered(stage="evaluate"), train]
        )
    )


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(gpus=[], warm_child=False, work_dir=tmp_path / "work", hub_token=None, progress_interval_s=0)


GATE = {"gate": [{"metric": "eval_loss", "at_most": 1.05, "of": "base"}]}


async def run_gated(core: CoreOnFakes, evaluation: dict[str, Any]) -> tuple[list[State], dict[str, Any]]:
    document = sft_request("gated", dataset={"id": "adapterd-test/chat", "eval": EVAL_SET}, evaluation=evaluation)
    record = core.record(document, 3)
    assert await core.scheduler.offer(core.tp, record, core.request(record)) is Offered.STARTED
    job = core.scheduler.jobs[core.tp]
    await job.task
    return job.runner.lifecycle.history, core.events("gated")[-1]


async def test_a_passing_gate_publishes_to_the_requested_revision_with_the_evaluation(settings: Settings) -> None:
    core = CoreOnFakes(settings, children=scripted(result({"eval_loss": 2.0}, base={"eval_loss": 2.0})))
    history, event = await run_gated(core, {**GATE, "on_fail": "none"})
    assert history == [State.QUEUED, State.TRAINING, State.JUDGING, State.PUSHING, State.SUCCEEDED]
    assert event["type"] == "succeeded" and event["published"] == "main" and event["revision"] == "main"
    assert event["evaluation"]["verdict"] == "pass" and event["evaluation"]["baselines"] == {"base": {"eval_loss": 2.0}}
    card = Path(event["location"], "README.md").read_text()
    assert "## Evaluation" in card and "| eval_loss | 2 | 2 |" in card and "model-index" in card
    assert core.consumer.commits == [(core.tp, 4)]


async def test_a_failing_gate_goes_to_its_side_branch_and_main_is_untouched(settings: Settings) -> None:
    core = CoreOnFakes(settings, children=scripted(result({"eval_loss": 9.0}, base={"eval_loss": 2.0})))
    history, event = await run_gated(core, {**GATE, "on_fail": "branch", "fail_branch": "gate-failed"})
    assert history == [State.QUEUED, State.TRAINING, State.JUDGING, State.PUSHING, State.SUCCEEDED]
    assert event["published"] == "branch" and event["revision"] == "gate-failed"
    assert event["evaluation"]["verdict"] == "fail" and event["evaluation"]["rules"][0]["outcome"] == "failed"
    outputs = settings.outputs_dir / "results"
    assert Path(event["location"]) == outputs / "gated@gate-failed" and not (outputs / "gated").exists()
    assert (
        core.consumer.commits == [(core.tp, 4)] and not core.dead_letters() and not core.requeued()
    )  # not failed, never retried


async def test_a_failing_gate_with_on_fail_none_publishes_nothing(settings: Settings) -> None:
    core = CoreOnFakes(
        settings, children=scripted(result({"eval_loss": math.nan}, base={"eval_loss": 2.0}, nonfinite_losses=2))
    )
    history, event = await run_gated(core, {**GATE, "on_fail": "none"})
    assert history == [State.QUEUED, State.TRAINING, State.JUDGING, State.SUCCEEDED]  # no push
    assert event["published"] == "none" and event["commit_sha"] is None
    assert Path(event["location"]) == settings.jobs_dir / "gated" / "artifact"
    assert "gate verdict: **fail**" in Path(event["location"], "README.md").read_text()  # the card says why it stayed
    assert not settings.outputs_dir.exists() or not any(settings.outputs_dir.rglob("*"))
    assert [rule["outcome"] for rule in event["evaluation"]["rules"]] == ["failed", "failed"]


async def test_a_child_that_reports_no_evaluation_for_a_gated_request_fails_the_job(settings: Settings) -> None:
    core = CoreOnFakes(settings, children=scripted(None))
    history, event = await run_gated(core, {**GATE, "on_fail": "none"})
    assert (
        history[-1] is State.FAILED
        and event["type"] == "failed"
        and event["stage"] == "evaluate"
        and event["code"] == "internal"
    )


async def test_on_the_local_sink_a_failing_gate_opens_its_pull_request_beside_main(settings: Settings) -> None:
    core = CoreOnFakes(settings, children=scripted(result({"eval_loss": 9.0}, base={"eval_loss": 2.0})))
    history, event = await run_gated(core, {**GATE, "on_fail": "pr"})
    assert history == [State.QUEUED, State.TRAINING, State.JUDGING, State.PUSHING, State.SUCCEEDED]
    outputs = settings.outputs_dir / "results"
    proposal = outputs / "gated#gated"  # <name>#<request id>: no branch's folder can be named so
    assert (event["published"], event["revision"], event["pr_url"]) == ("pr", "pr/gated", proposal.as_uri())
    assert Path(event["location"]) == proposal and "gate verdict: **fail**" in (proposal / "README.md").read_text()
    assert not (outputs / "gated").exists()  # main untouched
    assert core.consumer.commits == [(core.tp, 4)] and not core.dead_letters() and not core.requeued()


async def test_a_second_job_is_told_where_the_local_sinks_current_adapter_is(settings: Settings) -> None:
    children = scripted(result({"eval_loss": 2.0}, base={"eval_loss": 2.0}))
    core = CoreOnFakes(settings, children=children)
    await run_gated(core, {**GATE, "on_fail": "none"})
    first = children.taken[-1].spec
    assert first is not None and first.hub is False and first.local_current_adapter is None  # 'current' not asked for
    document = sft_request(
        "gated-2",
        dataset={"id": "adapterd-test/chat", "eval": EVAL_SET},
        output={"repo_id": "results/gated"},
        evaluation={"baselines": ["base", "current"], "on_fail": "none"},
    )
    record = core.record(document, 4)
    assert await core.scheduler.offer(core.tp, record, core.request(record)) is Offered.STARTED
    await core.scheduler.jobs[core.tp].task
    second = children.taken[-1].spec
    assert second is not None and second.local_current_adapter == settings.outputs_dir.resolve() / "results" / "gated"


def test_an_evaluations_reward_model_is_under_the_hosts_model_policy(settings: Settings) -> None:
    suite = {"kind": "rewards", "model": {"id": "someone/else-reward"}}
    document = sft_request(
        "gated",
        dataset={"id": "adapterd-test/chat", "eval": EVAL_SET},
        evaluation={"suites": [suite], "on_fail": "none"},
    )
    request = decode_request(json.dumps(document).encode())
    assert isinstance(request, RequestBase)
    host = settings.model_copy(update={"allowed_datasets": ["*"], "allowed_models": ["tiny/*"]})
    errors = policy_errors(request, host)
    assert [e.path for e in errors if e.path.startswith("evaluation")] == ["evaluation.suites.0.model.id"]
    assert "someone/else-reward is not allowed on this host" in errors[-1].message


def task_request(suite: dict[str, Any], dataset: dict[str, Any] | None = None) -> RequestBase:
    document = sft_request(
        "gated", dataset=dataset or {"id": "adapterd-test/chat"}, evaluation={"suites": [suite], "on_fail": "none"}
    )
    request = decode_request(json.dumps(document).encode())
    assert isinstance(request, RequestBase), request  # a task suite brings its own rows: no eval set needed
    return request


def test_a_task_suite_runs_only_a_task_the_operator_allows_on_rows_from_an_allowed_source(
    settings: Settings, tmp_path: Path
) -> None:
    host = settings.model_copy(
        update={"allowed_datasets": ["*"], "allowed_local_dataset_roots": [tmp_path], "max_dataset_rows": 2}
    )
    allowed = task_request({"kind": "task", "task": "arc_challenge", "source": {"url": str(tmp_path / "arc.jsonl")}})
    assert policy_errors(allowed, host) == []  # arc_challenge is among the tasks allowed by default
    refused = task_request(
        {"kind": "task", "task": "humaneval", "source": {"url": "/etc/passwd"}, "max_new_tokens": 10**6}
    )
    errors = {e.path: e.message for e in policy_errors(refused, host) if e.path.startswith("evaluation")}
    assert errors == {
        "evaluation.suites.0.task": (
            f"humaneval is not allowed on this host (allowed_evaluation_tasks: {host.allowed_evaluation_tasks})"
        ),
        "evaluation.suites.0.source.url": (
            f"local path /etc/passwd is outside allowed_local_dataset_roots (['{tmp_path}'])"
        ),
        "evaluation.suites.0.max_new_tokens": (
            f"1e+06; this host allows at most {host.max_new_tokens:g} (max_new_tokens)"
        ),
    }
    too_many = task_request({"kind": "task", "task": "arc_easy", "source": {"rows": [{"q": 1}, {"q": 2}, {"q": 3}]}})
    assert [(e.path, e.message) for e in policy_errors(too_many, host)] == [
        ("evaluation.suites.0.source.rows", "3 rows; this host allows at most 2 (max_dataset_rows)")
    ]
    nothing = host.model_copy(update={"allowed_evaluation_tasks": []})
    assert "allowed_evaluation_tasks: none" in policy_errors(allowed, nothing)[0].message


def test_a_task_suite_on_a_host_without_its_library_is_rejected(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("daemon.admission.policy.library_version", lambda name: None)
    request = task_request({"kind": "task", "task": "arc_easy", "source": {"rows": [{"q": 1}]}})
    errors = policy_errors(request, settings.model_copy(update={"allowed_datasets": ["*"]}))
    assert [(e.path, e.message) for e in errors] == [
        ("evaluation.suites.0.library", "lm-eval is not installed on this host (adapterd's 'lm-eval' extra)")
    ]
