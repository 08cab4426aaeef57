"""The child-side helpers every handler shares: progress throttling, checkpoint and stop messages,
and the TRL config the daemon's choices go into."""

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from handlers.protocol import JobSpec
from handlers.toolkit.callbacks import JobCallback
from handlers.toolkit.reporting import EXIT_STOPPED, StatusReporter
from handlers.toolkit.training import final_metrics, trl_config
from schemas import SFTRequest
from testbed.data import CHAT_ROWS
from tests.helpers import sft_request


def job_spec(tmp_path: Path, **fields: Any) -> JobSpec:
    return JobSpec(request={}, checkpoints=tmp_path / "checkpoints", artifact=tmp_path / "artifact", **fields)


def messages(read_fd: int) -> list[dict[str, Any]]:
    with os.fdopen(read_fd) as pipe:
        return [json.loads(line) for line in pipe]


def run_logs(tmp_path: Path, steps: int, extra: dict[str, float] | None = None, **fields: Any) -> list[dict[str, Any]]:
    """Feed a JobCallback the logs of `steps` steps, as a trainer would, and read what it sent."""
    read_fd, write_fd = os.pipe()
    reporter = StatusReporter(write_fd)
    callback = JobCallback(reporter, job_spec(tmp_path, **fields))
    args, control = SimpleNamespace(world_size=1, output_dir=str(tmp_path)), SimpleNamespace()
    state = SimpleNamespace(global_step=0, max_steps=steps, epoch=0.0)
    callback.on_train_begin(args, state, control)
    for step in range(1, steps + 1):
        state.global_step = step
        callback.on_step_end(args, state, control)
        callback.on_log(
            args,
            state,
            control,
            logs={
                "loss": 1.0 / step,
                "learning_rate": 0.1,
                "grad_norm": 0.5,
                "num_tokens": 100.0 * step,
                **(extra or {}),
            },
        )
    reporter._stream.close()
    return messages(read_fd)


def test_progress_every_n_steps_and_always_the_last(tmp_path: Path) -> None:
    sent = run_logs(tmp_path, 10, progress_interval_s=0, progress_interval_steps=3)
    progress = [m for m in sent if m["kind"] == "progress"]
    assert [m["step"] for m in progress] == [3, 6, 9, 10]
    assert progress[-1]["total_steps"] == 10 and progress[-1]["eta_s"] == 0
    assert all(m["tokens_per_s"] > 0 for m in progress)
    assert [m["step"] for m in sent if m["kind"] == "first_step"] == [1]


def test_progress_carries_the_online_methods_reward_as_trl_logs_it(tmp_path: Path) -> None:
    """GRPO and RLOO log `reward` (the mean over the step's completions) beside a loss that says little: a report
    carries it; a trainer that logs none (SFT) reports null."""
    grpo = run_logs(tmp_path / "grpo", 2, {"reward": 0.625, "reward_std": 0.1}, progress_interval_s=0)
    sft = run_logs(tmp_path / "sft", 2, progress_interval_s=0)
    assert [m["reward"] for m in grpo if m["kind"] == "progress"] == [0.625, 0.625]
    assert [m["reward"] for m in sft if m["kind"] == "progress"] == [None, None]


def test_progress_at_most_once_per_interval_in_seconds(tmp_path: Path) -> None:
    sent = run_logs(tmp_path, 10, progress_interval_s=3600, progress_interval_steps=1)
    assert [m["step"] for m in sent if m["kind"] == "progress"] == [1, 10]


def test_a_stop_request_saves_a_checkpoint_then_exits(tmp_path: Path) -> None:
    read_fd, write_fd = os.pipe()
    reporter = StatusReporter(write_fd)
    callback = JobCallback(reporter, job_spec(tmp_path, progress_interval_s=0))
    args, state = (
        SimpleNamespace(world_size=1, output_dir=str(tmp_path)),
        SimpleNamespace(global_step=7, max_steps=10, epoch=1.0),
    )
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    reporter.stop_requested = True  # what the runner's SIGTERM handler does while training
    callback.on_step_end(args, state, control)
    assert control.should_save and control.should_training_stop
    with pytest.raises(SystemExit) as exited:
        callback.on_save(args, state, control)
    assert exited.value.code == EXIT_STOPPED
    reporter._stream.close()
    sent = messages(read_fd)
    assert [m["kind"] for m in sent] == ["step", "checkpoint", "stopped"]  # a heartbeat, then the checkpoint
    assert sent[1]["path"] == str(tmp_path / "checkpoint-7")


def test_a_dataset_above_the_hosts_row_limit_fails_in_the_child(tmp_path: Path) -> None:
    from handlers.protocol import JobFailed
    from handlers.toolkit.loading import load_dataset_sources

    rows = SFTRequest.model_validate(sft_request("rows-1", dataset={"rows": CHAT_ROWS})).dataset
    with pytest.raises(JobFailed) as failure:
        load_dataset_sources(rows, job_spec(tmp_path, progress_interval_s=0, max_dataset_rows=4))
    assert failure.value.code == "dataset_too_large" and "max_dataset_rows" in failure.value.message
    train, _, _ = load_dataset_sources(rows, job_spec(tmp_path, progress_interval_s=0, max_dataset_rows=6))
    assert len(train) == 6


def test_trl_config_reports_only_to_what_the_job_allows(tmp_path: Path) -> None:
    from trl import SFTConfig

    request = SFTRequest.model_validate(sft_request("config-1"))
    quiet = trl_config(SFTConfig, request, job_spec(tmp_path, progress_interval_s=0), "sft")
    assert quiet.report_to in ("none", [], ["none"])
    reporting = trl_config(
        SFTConfig, request, job_spec(tmp_path, progress_interval_s=0, report_to=["tensorboard"]), "sft"
    )
    assert reporting.report_to == ["tensorboard"]
    assert reporting.output_dir == str(tmp_path / "checkpoints") and reporting.max_steps == 4


def test_the_median_step_time_leaves_the_first_step_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read_fd, write_fd = os.pipe()
    callback = JobCallback(StatusReporter(write_fd), job_spec(tmp_path, progress_interval_s=3600))
    args, control = SimpleNamespace(world_size=1, output_dir=str(tmp_path)), SimpleNamespace()
    state = SimpleNamespace(global_step=0, max_steps=5, epoch=0.0)
    callback.on_train_begin(args, state, control)
    # Steps end at these clock readings; the first step's 30 s of set-up is not a step's pace.
    for step, now in enumerate([30.0, 31.0, 31.5, 33.5, 34.0], start=1):
        monkeypatch.setattr("handlers.toolkit.reporting.time.perf_counter", lambda now=now: now)
        state.global_step = step
        callback.on_step_end(args, state, control)
    trainer = SimpleNamespace(
        callback_handler=SimpleNamespace(callbacks=[callback]),
        state=SimpleNamespace(log_history=[]),
        args=SimpleNamespace(world_size=1),
        model=torch.nn.Linear(2, 3),
    )
    metrics = final_metrics(trainer, {"train_runtime": 34.0})
    assert metrics["median_step_s"] == 0.75  # of 1.0, 0.5, 2.0, 0.5
    # What the one process held of the model (handlers/toolkit/distributed/fsdp.py): all of it, 6
    # weights and 3 biases in float32.
    assert (metrics["rank0_param_count"], metrics["rank0_param_bytes"], metrics["rank0_trainable_param_count"]) == (
        9.0,
        36.0,
        9.0,
    )
    os.close(read_fd)


def test_a_source_larger_than_the_hosts_download_bound_fails_before_it_is_read(tmp_path: Path) -> None:
    from handlers.protocol import JobFailed
    from handlers.toolkit.loading import load_dataset_sources

    root = tmp_path / "data"
    root.mkdir()
    (root / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in CHAT_ROWS))
    size = (root / "train.jsonl").stat().st_size
    spec = SFTRequest.model_validate(sft_request("bytes-1", dataset={"url": str(root / "train.jsonl")})).dataset
    with pytest.raises(JobFailed) as failure:
        load_dataset_sources(
            spec,
            job_spec(tmp_path, progress_interval_s=0, max_dataset_bytes=size - 1, allowed_local_dataset_roots=[root]),
        )
    assert (
        failure.value.code == "download_too_large"
        and f"{size:,} bytes" in failure.value.message
        and "max_dataset_bytes" in failure.value.message
    )
    train, _, _ = load_dataset_sources(
        spec, job_spec(tmp_path, progress_interval_s=0, max_dataset_bytes=size, allowed_local_dataset_roots=[root])
    )
    assert len(train) == len(CHAT_ROWS)


def test_a_hub_model_larger_than_the_hosts_bound_is_never_downloaded(
    published: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    from handlers.protocol import JobFailed
    from handlers.toolkit import loading
    from schemas.request import ModelSpec
    from testbed.data import TINY_MODEL

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", published.endpoint)
    monkeypatch.setattr(loading, "snapshot_download", lambda *a, **k: pytest.fail("downloaded a model above the bound"))
    with pytest.raises(JobFailed) as failure:
        loading.resolve_model(ModelSpec(id=TINY_MODEL), max_bytes=1000)
    assert failure.value.code == "download_too_large" and failure.value.message.startswith(
        f"model.id: {TINY_MODEL} is "
    )


@pytest.mark.parametrize(
    ("template", "bound"),
    [
        ("{{ 'a' * 400000000 }}", "bytes of memory"),  # 21 characters, 400 MB when rendered
        ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", "took more than 2 s"),
    ],
)
def test_a_chat_template_that_exhausts_the_host_fails_in_preflight(template: str, bound: str) -> None:
    from handlers.protocol import JobFailed
    from handlers.toolkit.chat_template import check_template_render

    with pytest.raises(JobFailed) as failure:
        check_template_render(template, max_bytes=256 * 2**20, max_s=2)
    assert failure.value.code == "config_invalid" and failure.value.stage == "preflight"
    assert failure.value.message.startswith("model.chat_template: ") and bound in failure.value.message


def test_an_ordinary_chat_template_passes_the_preflight_render() -> None:
    from handlers.toolkit.chat_template import check_template_render

    check_template_render(
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}",
        max_bytes=256 * 2**20,
        max_s=10,
    )


def test_each_object_a_glob_expands_to_is_checked_against_the_allowed_urls(tmp_path: Path) -> None:
    """Intake matched `.../cur*/x.jsonl` against the operator's rule as written; the child checks what
    it expands to, and `curious/` is not `curated/` (fsspec's memory filesystem stands in for a bucket)."""
    import fsspec

    from handlers.protocol import JobFailed
    from handlers.toolkit.sources import _expand

    memory = fsspec.filesystem("memory")
    for folder in ("curated", "curious"):
        memory.pipe(f"/bucket/{folder}/x.jsonl", b'{"text": "rows"}\n')
    job = job_spec(tmp_path, progress_interval_s=0, allowed_dataset_urls=["memory:///bucket/curated/*"])
    assert [f.path for f in _expand("memory://bucket/curated/*.jsonl", None, job, "dataset.url")] == [
        "memory:///bucket/curated/x.jsonl"
    ]
    with pytest.raises(JobFailed) as failure:
        _expand("memory://bucket/cur*/x.jsonl", None, job, "dataset.url")
    assert (
        failure.value.message
        == "dataset.url: memory:///bucket/curious/x.jsonl is not allowed on this host (allowed_dataset_urls)"
    )


def test_the_split_stages_parts_add_up_to_their_stage_and_other_stages_are_not_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from handlers.toolkit import reporting

    now = [100.0]
    monkeypatch.setattr(reporting.time, "monotonic", lambda: now[0])
    read_fd, write_fd = os.pipe()
    reporter = StatusReporter(write_fd)

    def spend(seconds: float) -> None:
        now[0] += seconds

    reporter.enter("load_dataset")
    spend(1)
    reporting.part("weights")  # not a split stage: nothing to split
    spend(2)
    reporter.enter("load_model")
    spend(0.5)  # finding the model, its tokenizer
    reporting.part("cuda_init")
    spend(4)
    reporting.part("files")
    with reporting.loading_weights():
        spend(8)
    spend(16)  # the trainer's construction
    reporter.enter("train")
    spend(32)
    reporting.part("steps")
    spend(64)
    reporter.enter("save")
    reporter.close()
    messages(read_fd)
    assert reporter.durations_s == {
        "preflight": 0.0,
        "load_dataset": 3.0,
        "load_model": 28.5,
        "load_model.files": 0.5,
        "load_model.cuda_init": 4.0,
        "load_model.weights": 8.0,
        "load_model.trainer": 16.0,
        "train": 96.0,
        "train.first_step": 32.0,
        "train.steps": 64.0,
    }


@pytest.mark.slow
def test_an_sft_job_says_where_its_seconds_went(tiny_model_dir: Path, tmp_path: Path) -> None:
    from tests.helpers import run_handler

    result, sent = run_handler(
        sft_request(
            "stages", dataset={"rows": CHAT_ROWS}, model={"id": str(tiny_model_dir)}, training={"max_steps": 3}
        ),
        tmp_path,
    )
    durations = result.durations_s
    for stage, parts in {"load_model": ("files", "weights", "trainer"), "train": ("first_step", "steps")}.items():
        assert all(durations[f"{stage}.{name}"] > 0 for name in parts), durations
        split = sum(seconds for key, seconds in durations.items() if key.startswith(f"{stage}."))
        assert abs(split - durations[stage]) < 0.01, durations  # every second of the stage is in one of its parts
    assert "load_model.cuda_init" not in durations  # no CUDA here: nothing to start
    assert [m["step"] for m in sent if m["kind"] == "first_step"] == [1]


# A job run as the child runs it, in an interpreter of its own whose Hub endpoint is a server that
# records every request (huggingface_hub reads HF_ENDPOINT once, when it is imported).
LOCAL_JOB = """
import json, os, sys
from pathlib import Path
from tests.helpers import run_handler, sft_request
from testbed.data import CHAT_ROWS
result, _ = run_handler(sft_request("local-only", dataset={"rows": CHAT_ROWS}, model={"id": sys.argv[1]}, training={"max_steps": 2}), Path(sys.argv[2]))
print(type(result).__name__)
"""  # noqa: E501 (a script's text, run as written)


@pytest.mark.slow
def test_a_job_whose_model_and_data_are_local_makes_no_hub_call(tiny_model_dir: Path, tmp_path: Path) -> None:
    # Without the child's HF_HUB_DISABLE_TELEMETRY, TRL reports the trainer to the Hub and huggingface_hub
    # fetches its agent registry: two calls from a job that needs nothing from the Hub.
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    asked: list[str] = []

    class Recorder(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(f"GET {self.path}")
            self.send_error(404)

        do_HEAD = do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    from daemon.children.warm import child_environment
    from daemon.settings import Settings

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        os_env = {
            name: value
            for name, value in os.environ.items()
            if name not in ("HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY")
        }
        settings = Settings(
            hub_endpoint=f"http://127.0.0.1:{server.server_port}", hub_token=None, work_dir=tmp_path / "work"
        )
        with (
            pytest.MonkeyPatch.context() as patch
        ):  # the environment a job's child gets, from this one without the test's own Hub settings
            patch.setattr(os, "environ", os_env)
            env = child_environment(settings)
        out = subprocess.run(
            [sys.executable, "-c", LOCAL_JOB, str(tiny_model_dir), str(tmp_path / "job")],
            capture_output=True,
            text=True,
            env=env,
            cwd=Path(__file__).parents[2],
            timeout=240,
        )
    finally:
        server.shutdown()
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "TrainResult", out.stderr[-2000:]
    assert asked == [], asked


def test_the_eta_runs_at_the_pace_of_the_steps_after_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first step carries the run's set-up: an ETA paced by it would be several times too long (a resumed job
    with 25 steps left said 40 s for 15). None until a second step has ended; then the
    later steps' pace; 0 at the end."""
    from handlers.toolkit import reporting

    now = [1000.0]
    monkeypatch.setattr(reporting.time, "monotonic", lambda: now[0])
    read_fd, write_fd = os.pipe()
    reporter = StatusReporter(write_fd)
    callback = JobCallback(reporter, job_spec(tmp_path, progress_interval_s=0, progress_interval_steps=1))
    args, control = SimpleNamespace(world_size=1, output_dir=str(tmp_path)), SimpleNamespace()
    state = SimpleNamespace(global_step=2, max_steps=10, epoch=0.0)  # resumed at step 2
    callback.on_train_begin(args, state, control)
    for step, seconds in [(3, 8.0), (4, 0.5), (5, 0.5), (10, 2.5)]:
        now[0] += seconds
        state.global_step = step
        callback.on_step_end(args, state, control)
        callback.on_log(args, state, control, logs={"loss": 1.0})
    reporter._stream.close()
    etas = [(m["step"], m["eta_s"]) for m in messages(read_fd) if m["kind"] == "progress"]
    assert etas == [(3, None), (4, 0.5 * 6), (5, 0.5 * 5), (10, 0)]
