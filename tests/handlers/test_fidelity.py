"""Fidelity: the same small SFT and DPO LoRA jobs, run by TRL's own CLI (`trl sft` / `trl dpo` with
a YAML converted from the request) and by the daemon, log the same loss at every step.

Route on the daemon's side: the real daemon end to end (the `adapterd run` process, the local
Kafka broker and Hub server of the other slow tests, a warm child), and the per-step losses as a
downstream consumer sees them: the `progress` events on the events topic. With the test settings'
`progress_interval_s = 0` and the default `progress_interval_steps = 1`, the child sends one per
logged step, with the loss the trainer logged (`JobCallback.on_log`). The test also checks those
losses are the trainer's own: the `log_history` of `trainer_state.json` in the job's last
checkpoint (`<jobs_dir>/<request_id>/checkpoints/checkpoint-N`). On the CLI's side the losses come
from that same file in its `output_dir`. This route was chosen because the losses are observable
from outside, in the daemon's own event contract (docs/events.md), so the whole path is under test
(intake, the job spec, the warm child, the handler) and nothing is called the way only a test would.

Both sides run on the CPU (CUDA_VISIBLE_DEVICES="" for the daemon, so its child sees no GPU and
its config says `use_cpu`, and for the CLI), offline, from the same local model folder and rows;
TRL seeds itself (`set_seed(args.seed)`) before PEFT initialises the adapter, so each run is
deterministic and the two agree to float precision unless the arguments differ. Step 1's loss is
the base model's (LoRA's B starts at zero; DPO's is log 2), so the training arguments show from
step 2 on: hence 4 steps, a learning rate high enough to move the loss, and gradient clipping
that bites (`max_grad_norm` 0.1 against gradient norms of 0.15 to 1.1).

`cli_config` is the conversion: the request's meaning, said in the CLI's terms, including the
adapterd defaults that differ from the CLI's own (see its docstring).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from daemon.cli.demo.requests import PREFERENCE_ROWS
from daemon.settings import Settings
from schemas import Progress, Succeeded
from schemas.request import REQUEST_MODELS
from testbed.client import run_to_end
from testbed.data import CHAT_ROWS
from testbed.processes import DaemonProcess
from tests.helpers import example_request

# Relative, per step. The two routes run the same float32 arithmetic on the same CPU and agreed
# bit for bit in every run so far; 1e-5 (about 100 float32 epsilons) leaves room for a host whose
# reductions round differently. It is tighter than 1e-4 on purpose: a dropped `max_grad_norm`
# (0.1 -> TRL's 1.0) moved the SFT job's step-4 loss by only 1.1e-4 relative (Adam all but undoes
# the scale of a clip), while a learning rate 10% off, a dropped `lr_scheduler_type`, `seed` or
# LoRA `target_modules` moved a step by 4e-4 to 3e-2 relative (checked by hand, mutating
# handlers/toolkit/training.py `trl_config` / `lora_config` in the daemon's child).
RELATIVE_TOLERANCE = 1e-5
CLI_TIMEOUT_S = 240

# adapterd's own arguments for every job (handlers/toolkit/training.py `trl_config`): the first three
# unless the request sets them, the rest always.
ADAPTERD_DEFAULTS: dict[str, Any] = {"logging_steps": 1, "save_strategy": "steps", "save_total_limit": 2}
ADAPTERD_FIXED: dict[str, Any] = {"report_to": "none", "use_cpu": True, "disable_tqdm": True}


def cli_config(request: dict[str, Any], data_dir: Path, output_dir: Path) -> dict[str, Any]:
    """The `trl <method> --config` YAML for an adapterd request, with its inline rows written to
    `data_dir/train.jsonl` (the CLI's `dataset_name` is that folder: `datasets.load_dataset` reads
    its `train` split from the file's name).

    The request's defaults are adapterd's, not the CLI's, where the two differ:
    - `model.dtype` defaults to "auto" in adapterd; the CLI's `dtype` defaults to "float32";
    - adapterd's LoRA (`schemas.request_base.LoraSpec`) targets "all-linear" by default; the CLI's
      `lora_target_modules` defaults to None, which lets PEFT pick its per-architecture default
      (q_proj and v_proj for Qwen2); `r` 16, `lora_alpha` 32 and `lora_dropout` 0.05 are the same;
    - `use_peft` is off in the CLI unless set; a request has LoRA unless `peft` is null;
    - adapterd logs every step (`logging_steps` 1; TRL's configs default to 10), saves with
      `save_total_limit` 2, reports to nothing unless policy allows, and sets `use_cpu` when the
      child sees no CUDA (always here);
    - `training.seed` is both the trainer's seed and the seed adapterd mixes sources with; TRL's
      default seed (42) is adapterd's default too.
    Only what this test needs is converted: a local model folder and inline rows, without column
    renames, `max_samples`, an eval set or mixtures.
    """
    model = REQUEST_MODELS[request["method"]].model_validate(request)  # fills in adapterd's defaults
    assert model.model.id.startswith("/"), "the CLI runs offline: the model must be a local folder"
    assert model.dataset.rows is not None and not model.dataset.columns and model.dataset.max_samples is None
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in model.dataset.rows))

    config: dict[str, Any] = {
        "model_name_or_path": model.model.id,
        "dtype": model.model.dtype,
        "trust_remote_code": model.model.trust_remote_code,
        "dataset_name": str(data_dir),
        "dataset_train_split": "train",
    }
    if model.peft is not None:
        lora = model.peft
        targets = [lora.target_modules] if isinstance(lora.target_modules, str) else lora.target_modules
        config.update(
            use_peft=True,
            lora_r=lora.r,
            lora_alpha=lora.lora_alpha,
            lora_dropout=lora.lora_dropout,
            lora_target_modules=targets,
            use_rslora=lora.use_rslora,
            use_dora=lora.use_dora,
        )
    config.update(ADAPTERD_DEFAULTS)
    config.update(model.set_fields("training"))
    config.update(model.set_fields(model.method))
    config.update(ADAPTERD_FIXED, output_dir=str(output_dir))
    return config


async def run_cli(method: str, config: dict[str, Any], workdir: Path) -> list[dict[str, Any]]:
    """`trl <method> --config`, offline on the CPU; the log entries of its last checkpoint."""
    config_path = workdir / f"{method}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ADAPTERD_")},
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(workdir / "hf-home"),
        "CUDA_VISIBLE_DEVICES": "",
    }
    log = workdir / f"trl-{method}.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "trl"),
            method,
            "--config",
            str(config_path),
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with asyncio.timeout(CLI_TIMEOUT_S):
                code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert code == 0, f"trl {method} exited {code}:\n{log.read_text()[-4000:]}"
    return checkpoint_log(Path(config["output_dir"]))


def checkpoint_log(output_dir: Path) -> list[dict[str, Any]]:
    """The log history of the last checkpoint a trainer saved in `output_dir`."""
    checkpoints = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert checkpoints, f"no checkpoint in {output_dir}"
    return json.loads((checkpoints[-1] / "trainer_state.json").read_text())["log_history"]


def step_losses(log_history: list[dict[str, Any]]) -> dict[int, float]:
    return {entry["step"]: entry["loss"] for entry in log_history if "loss" in entry}


def assert_losses_agree(daemon: dict[int, float], cli: dict[int, float], max_steps: int) -> None:
    assert list(cli) == list(range(1, max_steps + 1)), cli
    assert list(daemon) == list(cli), (daemon, cli)
    differing = {
        step: (daemon[step], cli[step])
        for step in cli
        if abs(daemon[step] - cli[step]) > RELATIVE_TOLERANCE * abs(cli[step])
    }
    assert not differing, f"per-step losses differ (daemon, trl CLI): {differing}"


@pytest.fixture
def cpu_daemon(settings: Settings, tmp_path: Path) -> Iterator[DaemonProcess]:
    """The daemon with no GPU in sight: CPU slots, and a child whose `use_cpu` is set, as the CLI's is."""
    process = DaemonProcess(settings, tmp_path / "daemon.log", extra_env={"CUDA_VISIBLE_DEVICES": ""}).start()
    yield process
    process.stop()


@pytest.fixture
def model_dir(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The tiny model in a folder both routes read: under tmp_path, a local root the test settings allow."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "tiny-model"))


async def both_routes(
    settings: Settings, request: dict[str, Any], tmp_path: Path
) -> tuple[dict[int, float], dict[int, float]]:
    """Per-step losses (daemon, CLI): the two run at once, the CLI in its own folder."""
    workdir = tmp_path / "trl-cli"
    config = cli_config(request, workdir / "data", workdir / "output")
    events, cli_log = await asyncio.gather(run_to_end(settings, request), run_cli(request["method"], config, workdir))
    done = events[-1]
    assert isinstance(done, Succeeded), done
    daemon_losses = {
        event.step: event.loss for event in events if isinstance(event, Progress) and event.loss is not None
    }
    checkpoints = settings.jobs_dir / request["request_id"] / "checkpoints"
    assert daemon_losses == step_losses(checkpoint_log(checkpoints)), (
        "progress events do not carry the trainer's logged losses"
    )
    return daemon_losses, step_losses(cli_log)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "learning_rate", "block"),
    [
        ("sft", 3e-2, {"max_length": 64}),
        ("dpo", 5e-2, {"beta": 0.1, "loss_type": ["sigmoid"], "max_length": 64}),
    ],
)
async def test_lora_losses_match_trls_own_cli(
    cpu_daemon: DaemonProcess,
    settings: Settings,
    model_dir: Path,
    tmp_path: Path,
    method: str,
    learning_rate: float,
    block: dict[str, Any],
) -> None:
    """`trl sft` / `trl dpo` and the daemon, on the same request: the same loss at every step."""
    training = {
        "max_steps": 4,
        "learning_rate": learning_rate,
        "per_device_train_batch_size": 2,
        "lr_scheduler_type": "cosine",
        "max_grad_norm": 0.1,
        "seed": 7,
    }
    request = example_request(
        method,
        f"fidelity-{method}",
        model={"id": str(model_dir)},
        dataset={"rows": CHAT_ROWS if method == "sft" else PREFERENCE_ROWS},
        peft={"r": 4, "lora_alpha": 8, "lora_dropout": 0.0},
        training=training,
        **{method: block},
    )
    daemon_losses, cli_losses = await both_routes(settings, request, tmp_path)
    assert_losses_agree(daemon_losses, cli_losses, training["max_steps"])
