"""The evaluation's `task` suite: a named task of lm-eval, scored on the request's own rows, for the
adapter and each baseline alike; and what is refused before anything is scored."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from daemon.settings import VETTED_EVALUATION_TASKS, Settings
from handlers.protocol import JobFailed, JobSpec, TrainResult
from schemas import Succeeded
from schemas.evaluation import TaskSuite
from testbed.client import run_to_end
from testbed.data import CHAT_ROWS
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import example_request, run_handler


def arc_rows(answers: str) -> list[dict[str, Any]]:
    """ARC rows whose four choices are the same text, so that every model finds them equally likely
    and lm-eval picks the first: a row is right exactly when its answer is A, whatever the model."""
    return [
        {
            "id": f"q{i}",
            "question": f"Which is it, {i}?",
            "choices": {"text": ["blue"] * 4, "label": list("ABCD")},
            "answerKey": key,
        }
        for i, key in enumerate(answers)
    ]


def task_request(request_id: str, model: Path, suite: dict[str, Any], **evaluation: Any) -> dict[str, Any]:
    request = example_request(
        "sft",
        request_id,
        dataset={"rows": CHAT_ROWS},
        evaluation={"suites": [suite], **evaluation},
        training={"max_steps": 2, "per_device_train_batch_size": 2, "per_device_eval_batch_size": 1},
    )
    request["model"] = {"id": str(model)}
    return request


def task_job(request_id: str, model: Path, work: Path) -> JobSpec:
    """A job to prepare a suite for outside a handler (the suite's own rows are what count)."""
    request = task_request(request_id, model, {"kind": "task", "task": "arc_easy", "source": {"rows": arc_rows("A")}})
    return JobSpec(request=request, checkpoints=work / "checkpoints", artifact=work / "artifact", progress_interval_s=0)


def test_a_task_of_lm_eval_scores_the_requests_own_rows_for_the_adapter_and_the_base(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    suite = {"kind": "task", "task": "arc_easy", "source": {"rows": arc_rows("AABA")}}
    result, sent = run_handler(
        task_request("eval-task", tiny_model_dir, suite, gate=[{"metric": "task/arc_easy/acc", "at_least": 0.75}]),
        tmp_path,
    )
    assert isinstance(result, TrainResult), result
    evaluation = result.evaluation
    assert evaluation is not None
    for scores in (evaluation.adapter, evaluation.baselines["base"]):
        # Three of the four rows answer A: these rows were scored, not ARC's own.
        assert scores.metrics["task/arc_easy/acc"] == 0.75 and scores.metrics["task/arc_easy/acc_norm"] == 0.75
        assert scores.metrics["task/arc_easy/acc_stderr"] == pytest.approx(
            0.25
        )  # sqrt(p(1-p)/(n-1)), lm-eval's sample stderr
    assert evaluation.libraries == {"lm-eval": version("lm-eval")}
    [source] = evaluation.task_sources
    assert (source.role, source.kind) == ("eval", "inline")
    assert evaluation.rows is None  # no eval set: the task's rows are its own
    task_file = tmp_path / "evaluation_tasks" / "0" / "task.yaml"
    assert (
        "dataset_path: json" in task_file.read_text()
        and len((task_file.parent / "rows.jsonl").read_text().splitlines()) == 4
    )
    assert [m["stage"] for m in sent if m["kind"] == "stage"][-3:] == ["save", "evaluate", "done"]


def test_limit_scores_the_first_rows_and_few_shot_examples_come_from_the_same_rows(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from handlers.toolkit.evaluation import task as evaluation_task

    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        AutoTokenizer.from_pretrained(tiny_model_dir),
    )
    job = task_job("eval-limit", tiny_model_dir, tmp_path)
    first_two = TaskSuite(kind="task", task="arc_easy", source={"rows": arc_rows("AABB")}, limit=2, num_fewshot=1)  # type: ignore[arg-type]
    prepared = evaluation_task.prepare(first_two, "evaluation.suites.0", job, tmp_path / "task")
    assert prepared.rows == 4
    assert (
        evaluation_task.score(model, tokenizer, prepared, batch_size=1)["task/arc_easy/acc"] == 1.0
    )  # rows 0 and 1 answer A
    every = TaskSuite(kind="task", task="arc_easy", source={"rows": arc_rows("AABB")}, num_fewshot=1)  # type: ignore[arg-type]
    assert (
        evaluation_task.score(
            model, tokenizer, evaluation_task.prepare(every, "evaluation.suites.0", job, tmp_path / "every"), 1
        )["task/arc_easy/acc"]
        == 0.5
    )


# Rows with each vetted task's own columns, as its dataset on the Hub has them.
VETTED_ROWS: dict[str, dict[str, Any]] = {
    "arc_easy": arc_rows("A")[0],
    "arc_challenge": arc_rows("B")[0],
    "boolq": {"question": "is the sky blue", "passage": "The sky is blue.", "label": 1},
    "hellaswag": {
        "activity_label": "Cooking",
        "ctx_a": "A man cracks an egg.",
        "ctx_b": "he",
        "endings": ["fries it.", "sings.", "runs.", "sleeps."],
        "label": "0",
    },
    "openbookqa": {
        "question_stem": "The sun is",
        "choices": {"text": ["hot", "cold", "blue", "small"], "label": list("ABCD")},
        "answerKey": "A",
    },
    "piqa": {"goal": "Open a jar", "sol1": "Twist the lid.", "sol2": "Eat the lid.", "label": 0},
    "sciq": {
        "support": "Water boils at 100 C.",
        "question": "When does water boil?",
        "distractor1": "0 C",
        "distractor2": "50 C",
        "distractor3": "20 C",
        "correct_answer": "100 C",
    },
    "winogrande": {
        "sentence": "The cup did not fit in the box because the _ was too big.",
        "option1": "cup",
        "option2": "box",
        "answer": "1",
    },
    "gsm8k": {"question": "What is two plus two?", "answer": "Two and two make four.\n#### 4"},
}


def test_every_task_the_host_allows_by_default_runs_offline_on_given_rows(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from handlers.toolkit.evaluation import task as evaluation_task

    assert set(VETTED_ROWS) == set(VETTED_EVALUATION_TASKS)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing fetched: the rows are the request's
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        AutoTokenizer.from_pretrained(tiny_model_dir),
    )
    job = task_job("eval-vetted", tiny_model_dir, tmp_path)
    for task, row in VETTED_ROWS.items():
        suite = TaskSuite(kind="task", task=task, source={"rows": [row, row]}, max_new_tokens=4)  # type: ignore[arg-type]
        metrics = evaluation_task.score(
            model, tokenizer, evaluation_task.prepare(suite, "evaluation.suites.0", job, tmp_path / task), batch_size=2
        )
        headline = "exact_match/strict-match" if task == "gsm8k" else "acc"
        assert 0.0 <= metrics[f"task/{task}/{headline}"] <= 1.0, (task, metrics)


@pytest.mark.parametrize(
    ("task", "why"),
    [
        ("no_such_task", "has no task 'no_such_task' defined by its own YAML file"),
        ("mmlu", "has no task 'mmlu' defined by its own YAML file"),  # a group of tasks, not one
    ],
)
def test_a_task_the_installed_library_lacks_fails_naming_the_field(
    task: str, why: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from handlers.toolkit.evaluation import task as evaluation_task

    suite = TaskSuite(kind="task", task=task, source={"rows": arc_rows("A")})  # type: ignore[arg-type]
    job = task_job("eval-missing", tiny_model_dir, tmp_path)
    with pytest.raises(JobFailed) as failure:
        evaluation_task.prepare(suite, "evaluation.suites.2", job, tmp_path / "task")
    assert (failure.value.code, failure.value.stage) == ("config_invalid", "evaluate")
    assert failure.value.message == f"evaluation.suites.2.task: lm-eval {version('lm-eval')} {why}"
    assert not (tmp_path / "task").exists()  # refused before a row was read or a file written


def test_rows_without_the_tasks_columns_fail_as_the_datasets_fault(tiny_model_dir: Path, tmp_path: Path) -> None:
    suite = {"kind": "task", "task": "arc_easy", "source": {"rows": [{"question": "no choices here"}]}}
    failure, _ = run_handler(task_request("eval-columns", tiny_model_dir, suite, baselines=[]), tmp_path)
    assert not isinstance(failure, TrainResult)
    assert (failure.code, failure.stage) == ("dataset_invalid", "evaluate")
    assert failure.message.startswith("evaluation.suites.0.source: lm-eval's arc_easy cannot score these rows"), (
        failure.message
    )


def test_the_task_file_names_only_the_rows_written_for_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The harness's own dataset (a Hub id) never reaches it: the file it reads says `json` and the
    job's own rows file, whatever the included YAML says."""
    from handlers.toolkit.evaluation import task as evaluation_task

    job = task_job("eval-file", tiny_model_dir, tmp_path)
    suite = TaskSuite(kind="task", task="hellaswag", source={"rows": [VETTED_ROWS["hellaswag"]]})  # type: ignore[arg-type]
    prepared = evaluation_task.prepare(suite, "evaluation.suites.0", job, tmp_path / "task")
    import yaml

    assert prepared.manager.all_subtasks == ["hellaswag"]  # the job's own file is all the manager knows
    assert Path(prepared.manager.task_index["hellaswag"].yaml_path) == tmp_path / "task" / "task.yaml"

    written = yaml.safe_load((tmp_path / "task" / "task.yaml").read_text())
    assert written["dataset_path"] == "json" and written["dataset_kwargs"] == {
        "data_files": {"test": str(tmp_path / "task" / "rows.jsonl")}
    }
    assert written["include"].endswith("lm_eval/tasks/hellaswag/hellaswag.yaml")
    assert json.loads((tmp_path / "task" / "rows.jsonl").read_text())["ctx_a"] == "A man cracks an egg."


@pytest.mark.slow
async def test_through_the_daemon_a_task_suite_judges_the_adapter_and_lands_in_the_event_and_the_card(
    shared_daemon: DaemonProcess,
    published: HubServer,
    shared_settings: Settings,
) -> None:
    suite = {"kind": "task", "task": "arc_easy", "source": {"rows": arc_rows("AABA")}}
    request = example_request(
        "sft",
        "gate-task",
        dataset={"rows": CHAT_ROWS},
        training={"max_steps": 2, "per_device_train_batch_size": 2},
        evaluation={"suites": [suite], "gate": [{"metric": "task/arc_easy/acc", "at_least": 1.0, "of": "base"}]},
    )
    done = (await run_to_end(shared_settings, request))[-1]
    assert isinstance(done, Succeeded), done
    evaluation = done.evaluation
    assert evaluation is not None and evaluation.verdict == "pass" and done.published == "main"
    assert evaluation.adapter["task/arc_easy/acc"] == evaluation.baselines["base"]["task/arc_easy/acc"] == 0.75
    assert evaluation.rules[0].bound == 0.75 and evaluation.libraries == {"lm-eval": version("lm-eval")}
    assert [(s.role, s.kind) for s in evaluation.task_sources] == [("eval", "inline")]
    [commit] = published.commits("results/gate-task")
    card = commit.files["README.md"].decode()
    assert "task/arc_easy/acc (base)" in card and "gate verdict: **pass**" in card
