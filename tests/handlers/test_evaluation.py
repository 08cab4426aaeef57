"""The request's `evaluation` (handlers/toolkit/evaluation/__init__.py, daemon/job/gate.py): in the child, each model
measured by its trainer on the eval rows; through the daemon, the gate's verdict deciding where the
adapter goes on the (local) Hub: main, a pull request, judged against the adapter already there."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from daemon.cli.demo.requests import LABELLED_ROWS, PREFERENCE_ROWS, PROMPT_ROWS
from daemon.settings import Settings
from handlers.protocol import TrainResult
from schemas import Succeeded
from testbed.client import run_to_end
from testbed.data import CHAT_ROWS
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import example_request, other_model, run_handler

EVAL_ROWS = CHAT_ROWS[:4]
LOSS_GATE = {"metric": "eval_loss", "at_most": 1.0, "of": "base"}  # no worse than the base model


def gated(request_id: str, evaluation: dict[str, Any], model: str | None = None, **overrides: Any) -> dict[str, Any]:
    request = example_request(
        "sft", request_id, dataset={"rows": CHAT_ROWS, "eval": {"rows": EVAL_ROWS}}, evaluation=evaluation, **overrides
    )
    if model is not None:
        request["model"] = {"id": model}
    return request


def test_the_adapter_and_the_base_are_measured_on_the_same_rows_and_only_the_adapter_is_saved(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    result, sent = run_handler(
        gated(
            "eval-sft",
            {"gate": [LOSS_GATE]},
            str(tiny_model_dir),
            training={
                "max_steps": 8,
                "learning_rate": 5e-2,
                "per_device_train_batch_size": 2,
                "per_device_eval_batch_size": 2,
            },
        ),
        tmp_path,
    )
    assert isinstance(result, TrainResult), result
    evaluation = result.evaluation
    assert evaluation is not None and evaluation.rows == len(EVAL_ROWS) and evaluation.missing_baselines == {}
    adapter, base = evaluation.adapter.metrics, evaluation.baselines["base"].metrics
    assert {"eval_loss", "eval_perplexity", "eval_mean_token_accuracy"} <= set(adapter) and set(adapter) == set(base)
    assert adapter["eval_perplexity"] == pytest.approx(math.exp(adapter["eval_loss"]))
    assert adapter["eval_loss"] < base["eval_loss"]  # eight steps at 5e-2 on these rows: it learned them
    assert evaluation.nonfinite_losses == 0 and evaluation.best_checkpoint_step is None
    assert [m["stage"] for m in sent if m["kind"] == "stage"][-3:] == ["save", "evaluate", "done"]
    assert "evaluate" in result.durations_s
    # Progress while it evaluates: each model's pass, batch by batch, at the last training step.
    evaluating = [m for m in sent if m["kind"] == "progress" and m["stage"] == "evaluate"]
    assert [(m["evaluating"], m["eval_batch"], m["eval_batches"]) for m in evaluating] == [
        ("base", 1, 2),
        ("base", 2, 2),
        ("adapter", 1, 2),
        ("adapter", 2, 2),  # 4 eval rows, 2 a batch
    ]
    assert all(m["step"] == m["total_steps"] == 8 for m in evaluating)
    # The baseline adapter was set aside: the artifact is the trained adapter alone, and B is not zero.
    artifact = tmp_path / "artifact"
    assert not [p for p in artifact.iterdir() if p.is_dir()]
    weights = load_file(artifact / "adapter_model.safetensors")
    assert all(".default." not in name and ".base." not in name for name in weights)
    assert any(float(w.abs().sum()) > 0 for name, w in weights.items() if "lora_B" in name)


def test_with_metric_for_best_model_the_best_evaluated_checkpoint_is_the_artifact(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    training = {
        "max_steps": 6,
        "learning_rate": 5e-2,
        "per_device_train_batch_size": 2,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "save_steps": 2,
        "load_best_model_at_end": True,
        "metric_for_best_model": "eval_loss",
    }
    result, _ = run_handler(gated("eval-best", {"baselines": []}, str(tiny_model_dir), training=training), tmp_path)
    assert isinstance(result, TrainResult), result
    assert result.evaluation is not None
    step = result.evaluation.best_checkpoint_step
    assert step in (2, 4, 6)
    best = load_file(tmp_path / "checkpoints" / f"checkpoint-{step}" / "adapter_model.safetensors")
    pushed = load_file(tmp_path / "artifact" / "adapter_model.safetensors")
    assert best.keys() == pushed.keys() and all(bool((best[k] == pushed[k]).all()) for k in best)


# Both a learning rate that trains and the one that diverged into NaN on some CPUs (and stayed flat
# and finite on others, issue 36): the NaN comes from the model, so the outcome is the same.
@pytest.mark.parametrize("learning_rate", [5e-3, 1e4])
def test_a_run_whose_losses_are_nan_reports_every_one_of_them(
    learning_rate: float, tiny_nan_model_dir: Path, tmp_path: Path
) -> None:
    result, sent = run_handler(
        gated(
            "eval-nan",
            {"gate": [LOSS_GATE]},
            str(tiny_nan_model_dir),
            training={
                "max_steps": 6,
                "learning_rate": learning_rate,
                "per_device_train_batch_size": 2,
                "logging_steps": 1,
            },
        ),
        tmp_path,
    )
    assert isinstance(result, TrainResult), result
    assert result.evaluation is not None
    # Every step's loss, as logged: NaN, not the running mean transformers' NaN filter would log in
    # its place (the filter is off for a gated job).
    logged = [m["loss"] for m in sent if m["kind"] == "progress" and m.get("loss") is not None]
    assert len(logged) == 6 and not any(math.isfinite(loss) for loss in logged), logged
    assert result.evaluation.nonfinite_losses == 6, result.evaluation
    assert not math.isfinite(result.evaluation.adapter.metrics["eval_loss"])


@pytest.mark.slow
async def test_a_passing_gate_goes_to_main_and_a_failing_one_into_a_pull_request(
    shared_daemon: DaemonProcess,
    published: HubServer,
    shared_settings: Settings,
    tiny_nan_model_dir: Path,
) -> None:
    training = {"max_steps": 8, "learning_rate": 5e-2, "per_device_train_batch_size": 2}
    passed = (await run_to_end(shared_settings, gated("gate-pass", {"gate": [LOSS_GATE]}, training=training)))[-1]
    assert isinstance(passed, Succeeded), passed
    assert passed.published == "main" and passed.revision == "main" and passed.pr_url is None
    assert passed.evaluation is not None and passed.evaluation.verdict == "pass"
    assert (
        passed.evaluation.rules[0].outcome == "passed" and passed.evaluation.baselines["base"]["eval_loss"] is not None
    )
    assert "evaluate" in passed.durations_s
    [commit] = published.commits("results/gate-pass")
    card = commit.files["README.md"].decode()
    assert (
        "## Evaluation" in card
        and "model-index" in card
        and "eval_loss (base)" in card
        and "gate verdict: **pass**" in card
    )
    assert published.pulls("results/gate-pass") == []

    # The same request on a second repo, on the tiny model poisoned with NaN (every loss NaN, on any
    # CPU; a large learning rate diverges on some and not on others): it fails its gate, goes to a
    # pull request, and main is untouched.
    nan_model = shutil.copytree(
        tiny_nan_model_dir, shared_settings.allowed_local_model_roots[0] / "tiny-nan-model", dirs_exist_ok=True
    )
    failed = (
        await run_to_end(shared_settings, gated("gate-fail", {"gate": [LOSS_GATE]}, str(nan_model), training=training))
    )[-1]
    assert isinstance(failed, Succeeded), failed
    assert failed.published == "pr" and failed.revision == "refs/pr/1" and failed.pr_url is not None
    assert failed.pr_url.endswith("/results/gate-fail/discussions/1")
    assert failed.evaluation is not None and failed.evaluation.verdict == "fail"
    assert failed.evaluation.nonfinite_losses == 8 and [r.outcome for r in failed.evaluation.rules] == [
        "failed",
        "failed",
    ]
    assert published.commits("results/gate-fail") == []  # nothing on main
    [pull] = published.pulls("results/gate-fail")
    [commit] = published.commits("results/gate-fail", revision=pull.ref)
    assert commit.sha == failed.commit_sha and "gate verdict: **fail**" in commit.files["README.md"].decode()

    # A second job on the repo that now has an adapter on main is judged against it too.
    again = (
        await run_to_end(
            shared_settings,
            {
                **gated(
                    "gate-pass-2",
                    {
                        "baselines": ["base", "current"],
                        "gate": [{"metric": "eval_loss", "at_most": 1.5, "of": "current"}],
                    },
                    training=training,
                ),
                "output": {"repo_id": "results/gate-pass"},
            },
        )
    )[-1]
    assert isinstance(again, Succeeded), again
    assert again.evaluation is not None and again.evaluation.baseline_revisions.get("current") == passed.commit_sha
    assert set(again.evaluation.baselines) == {"base", "current"}
    assert again.evaluation.rules[0].baseline == again.evaluation.baselines["current"]["eval_loss"]
    assert again.published == ("main" if again.evaluation.verdict == "pass" else "pr")


HELD_OUT_PROMPTS = [
    {"prompt": "One plus one equals", "answer": "two"},
    {"prompt": "The capital of Italy is", "answer": "Rome"},
    {"prompt": "Four plus four equals", "answer": "eight"},
    {"prompt": "Kafka's partitions keep", "answer": "order"},
]


@pytest.mark.slow
async def test_grpo_is_scored_by_its_rewards_on_held_out_prompts_against_the_base(
    shared_daemon: DaemonProcess,
    published: HubServer,
    shared_settings: Settings,
) -> None:
    request = example_request(
        "grpo",
        "eval-grpo",
        dataset={"rows": PROMPT_ROWS, "eval": {"rows": HELD_OUT_PROMPTS}},
        grpo={"num_generations": 4, "max_completion_length": 8, "beta": 0.0},
        training={
            "max_steps": 2,
            "learning_rate": 1e-2,
            "per_device_train_batch_size": 4,
            "per_device_eval_batch_size": 4,
        },
        evaluation={"gate": [{"metric": "eval_reward", "at_least": 1.0, "of": "base"}], "on_fail": "none"},
    )
    request["rewards"].pop("model", None)  # the example's reward model is a Hub repo; its functions suffice
    done = (await run_to_end(shared_settings, request))[-1]
    assert isinstance(done, Succeeded), done
    assert done.evaluation is not None and done.evaluation.rows == len(HELD_OUT_PROMPTS)
    adapter, base = done.evaluation.adapter, done.evaluation.baselines["base"]
    # The mean reward of the completions each model generated for the held-out prompts, and each reward function's.
    assert {"eval_reward", "eval_rewards/exact_match/mean", "eval_rewards/length_penalty/mean"} <= set(adapter) & set(
        base
    )
    [rule] = [r for r in done.evaluation.rules if r.metric == "eval_reward"]
    assert (rule.value, rule.baseline) == (adapter["eval_reward"], base["eval_reward"])
    assert done.published == ("main" if done.evaluation.verdict == "pass" else "none")
    assert len(published.commits("results/eval-grpo")) == (1 if done.published == "main" else 0)


def test_dpo_reports_preference_accuracy_and_margins_and_the_base_is_its_own_reference(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    request = example_request(
        "dpo",
        "eval-dpo",
        dataset={"rows": PREFERENCE_ROWS, "eval": {"rows": PREFERENCE_ROWS[:2]}},
        training={"max_steps": 4, "learning_rate": 5e-2, "per_device_train_batch_size": 2},
        evaluation={"gate": [{"metric": "eval_rewards/accuracies", "at_least": 0.5}]},
    )
    request["model"] = {"id": str(tiny_model_dir)}
    result, _ = run_handler(request, tmp_path)
    assert isinstance(result, TrainResult), result
    assert result.evaluation is not None
    adapter, base = result.evaluation.adapter.metrics, result.evaluation.baselines["base"].metrics
    assert {"eval_loss", "eval_rewards/accuracies", "eval_rewards/margins"} <= set(adapter)
    # The base baseline is the base model exactly, and DPO's reference is the base: its implicit
    # rewards, and so its margins, are zero; the trained adapter's are not.
    assert base["eval_rewards/margins"] == pytest.approx(0.0, abs=1e-6) and base["eval_loss"] == pytest.approx(
        math.log(2), abs=1e-4
    )
    assert adapter["eval_rewards/margins"] != pytest.approx(0.0, abs=1e-6)


def test_on_a_host_without_a_hub_the_current_adapter_is_the_local_sinks(tiny_model_dir: Path, tmp_path: Path) -> None:
    training = {"max_steps": 4, "learning_rate": 5e-2, "per_device_train_batch_size": 2}
    first, _ = run_handler(
        gated("local-1", {"baselines": []}, str(tiny_model_dir), training=training), tmp_path / "first"
    )
    assert isinstance(first, TrainResult), first
    evaluation = {"baselines": ["base", "current"], "gate": [{"metric": "eval_loss", "at_most": 1.0, "of": "current"}]}
    # No adapter at the target yet: the baseline is missing, and nothing is asked of a Hub.
    alone, _ = run_handler(
        gated("local-2", evaluation, str(tiny_model_dir), training=training), tmp_path / "alone", hub=False
    )
    assert isinstance(alone, TrainResult) and alone.evaluation is not None, alone
    assert (
        set(alone.evaluation.baselines) == {"base"}
        and "local sink holds no adapter" in alone.evaluation.missing_baselines["current"]
    )
    second, _ = run_handler(
        gated("local-2", evaluation, str(tiny_model_dir), training=training),
        tmp_path / "second",
        hub=False,
        local_current_adapter=tmp_path / "first" / "artifact",
    )
    assert isinstance(second, TrainResult) and second.evaluation is not None, second
    current = second.evaluation.baselines["current"]
    # The same weights on the same rows: the first job's own number, and not the base's.
    assert first.evaluation is not None and current.revision is None
    assert current.metrics["eval_loss"] == pytest.approx(first.evaluation.adapter.metrics["eval_loss"], rel=1e-4)
    assert current.metrics["eval_loss"] != pytest.approx(
        second.evaluation.baselines["base"].metrics["eval_loss"], rel=1e-4
    )


@pytest.mark.parametrize("method", ["kto", "reward", "orpo", "cpo", "rloo", "distillation", "gkd"])
def test_every_other_method_measures_its_adapter_and_the_base_alike(
    method: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    rows = {
        "kto": LABELLED_ROWS,
        "reward": PREFERENCE_ROWS,
        "orpo": PREFERENCE_ROWS,
        "cpo": PREFERENCE_ROWS,
        "rloo": PROMPT_ROWS,
        "distillation": PROMPT_ROWS,
        "gkd": CHAT_ROWS,
    }[method]
    eval_rows = HELD_OUT_PROMPTS if method in ("rloo", "distillation") else rows[:2]
    extra: dict[str, Any] = {
        "rloo": {"num_generations": 4, "max_completion_length": 8},
        "distillation": {"max_completion_length": 8},
        "gkd": {"max_new_tokens": 8},
    }.get(method, {})
    request = example_request(
        method,
        f"eval-{method}",
        dataset={"rows": rows, "eval": {"rows": eval_rows}},
        training={
            "max_steps": 2,
            "learning_rate": 1e-2,
            "per_device_train_batch_size": 4 if method == "rloo" else 2,
            "per_device_eval_batch_size": 4 if method == "rloo" else 2,
        },
        evaluation={"gate": [{"metric": "eval_loss" if method != "rloo" else "eval_reward", "at_most": 1e9}]},
        **({method: {**example_request(method, "x").get(method, {}), **extra}} if extra else {}),
    )
    request["model"] = {"id": str(tiny_model_dir)}
    if method in ("distillation", "gkd"):
        request["teacher_model"] = {"id": str(other_model(tiny_model_dir, tmp_path / "teacher"))}
    if "rewards" in request:
        request["rewards"].pop("model", None)  # the example's reward model is a Hub repo; its functions suffice
    result, _ = run_handler(request, tmp_path)
    assert isinstance(result, TrainResult), result
    assert result.evaluation is not None
    adapter, base = result.evaluation.adapter.metrics, result.evaluation.baselines["base"].metrics
    assert adapter and set(adapter) == set(base), (adapter, base)
    assert ("eval_reward" if method == "rloo" else "eval_loss") in adapter
    if method in ("orpo", "cpo"):  # the preference measures, as for dpo
        assert {"eval_rewards/accuracies", "eval_rewards/margins"} <= set(adapter), adapter
    assert not [p for p in (tmp_path / "artifact").iterdir() if p.is_dir()]  # the baseline adapter is not saved


def test_an_eval_set_carved_from_the_training_rows_is_the_same_on_every_attempt(tmp_path: Path) -> None:
    from handlers.protocol import JobFailed, JobSpec
    from handlers.toolkit.loading import load_dataset_sources
    from schemas.request import SFTRequest

    def split(fraction: float | int, seed: int) -> tuple[list[str], list[str]]:
        request = SFTRequest.model_validate(
            example_request("sft", "carve", dataset={"rows": CHAT_ROWS, "test_split_size": fraction})
        )
        job = JobSpec(
            request=request.model_dump(mode="json"),
            checkpoints=tmp_path / "c",
            artifact=tmp_path / "a",
            progress_interval_s=0,
        )
        train, evaluation, _ = load_dataset_sources(request.dataset, job, seed=seed)
        assert evaluation is not None
        return [json.dumps(r["messages"]) for r in train], [json.dumps(r["messages"]) for r in evaluation]

    train, held_out = split(0.25, 42)
    assert len(held_out) == 2 and len(train) == len(CHAT_ROWS) - 2
    assert sorted(train + held_out) == sorted(json.dumps(r["messages"]) for r in CHAT_ROWS)  # a partition of the rows
    assert split(0.25, 42) == (train, held_out)  # the next attempt evaluates the same rows
    assert split(0.25, 7) != (train, held_out)  # chosen by the seed
    with pytest.raises(
        JobFailed, match=rf"dataset.test_split_size: 0.9 of {len(CHAT_ROWS)} rows: .*train set will be empty"
    ):
        split(0.9, 42)  # nothing left to train on
    counted, counted_out = split(3, 42)  # a count of rows, as the handbook's test_split_size: 1000 is
    assert len(counted_out) == 3 and len(counted) == len(CHAT_ROWS) - 3 and split(3, 42) == (counted, counted_out)
    with pytest.raises(JobFailed, match=rf"dataset.test_split_size: {len(CHAT_ROWS)} of {len(CHAT_ROWS)} rows"):
        split(len(CHAT_ROWS), 42)


def test_an_sft_adapter_and_its_base_are_scored_by_reward_functions_on_their_answers(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    rewards = {
        "kind": "rewards",
        "max_new_tokens": 8,
        "pass_threshold": 0.5,
        "functions": [
            {"name": "regex_match", "pattern": "[a-z]"},
            {"name": "length_penalty", "target_chars": 20, "weight": 0.5},
        ],
        "model": {"id": str(tiny_model_dir), "weight": 0.1},
    }  # the tiny model as a reward model: its score head is new
    request = gated(
        "eval-rewards",
        {"suites": [{"kind": "method"}, rewards], "gate": [{"metric": "reward_mean", "at_least": 1.0, "of": "base"}]},
        str(tiny_model_dir),
        training={"max_steps": 4, "learning_rate": 5e-2, "per_device_train_batch_size": 2},
    )
    result, _ = run_handler(request, tmp_path)
    assert isinstance(result, TrainResult), result
    assert result.evaluation is not None
    for scores in (result.evaluation.adapter, result.evaluation.baselines["base"]):
        metrics = scores.metrics
        assert {
            "eval_loss",
            "reward_mean",
            "reward_pass_rate",
            "rewards/regex_match/mean",
            "rewards/length_penalty/mean",
            "rewards/model/mean",
        } <= set(metrics)
        assert metrics["reward_answers"] == len(EVAL_ROWS) and 0.0 <= metrics["reward_pass_rate"] <= 1.0
        assert 0.0 <= metrics["rewards/regex_match/mean"] <= 1.0
        # The weighted sum, averaged: each function's mean times its weight.
        assert metrics["reward_mean"] == pytest.approx(
            metrics["rewards/regex_match/mean"]
            + 0.5 * metrics["rewards/length_penalty/mean"]
            + 0.1 * metrics["rewards/model/mean"]
        )


def test_a_reward_function_whose_column_the_eval_rows_lack_fails_naming_the_suite(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    rewards = {"kind": "rewards", "functions": [{"name": "exact_match", "column": "answer"}]}
    request = gated(
        "eval-no-column",
        {"suites": [rewards], "baselines": []},
        str(tiny_model_dir),
        training={"max_steps": 1, "per_device_train_batch_size": 2},
    )
    failure, _ = run_handler(request, tmp_path)
    assert not isinstance(failure, TrainResult)
    assert (failure.code, failure.stage) == ("dataset_invalid", "evaluate")
    assert failure.message.startswith("evaluation.suites.0: exact_match reads column(s) ['answer']"), failure.message


def test_an_adapter_made_by_pissa_has_no_base_to_compare_with(tiny_model_dir: Path, tmp_path: Path) -> None:
    request = gated(
        "eval-pissa",
        {"gate": [LOSS_GATE]},
        str(tiny_model_dir),
        training={"max_steps": 1, "per_device_train_batch_size": 2},
        peft={"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "init_lora_weights": "pissa"},
    )
    result, _ = run_handler(request, tmp_path)
    assert isinstance(result, TrainResult), result
    assert result.evaluation is not None and result.evaluation.baselines == {}
    assert "'pissa' changed the base weights" in result.evaluation.missing_baselines["base"]
