"""The `adapterd` command line, as users call it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from daemon.cli.app import app
from daemon.settings import Settings
from testbed.client import read_records
from testbed.processes import settings_environment
from tests.helpers import sft_request

runner = CliRunner()


def write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(document))
    return path


def test_validate_accepts_a_valid_request(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(write(tmp_path, sft_request("cli-ok")))])
    assert result.exit_code == 0, result.output
    assert "valid sft request cli-ok" in result.output


def test_validate_names_each_bad_field(tmp_path: Path) -> None:
    request = sft_request("cli-bad")
    request["peft"] = {"r": 0, "alpha": 3}
    result = runner.invoke(app, ["validate", str(write(tmp_path, request))])
    assert result.exit_code == 2
    assert "peft.r:" in result.output and "peft.alpha: unknown field" in result.output


@pytest.mark.parametrize(("block", "field", "names"), [
    ("training", "output_dir", ("transformers.TrainingArguments.output_dir", "set by the daemon", "the job's folder")),
    ("sft", "chat_template_path", ("trl.SFTConfig.chat_template_path", "a path or address on the host", "use model.chat_template")),
    ("peft", "task_type", ("peft.LoraConfig.task_type", "set by the daemon", "the method decides it")),
])
def test_validate_names_a_refused_trl_field_and_why(tmp_path: Path, block: str, field: str, names: tuple[str, ...]) -> None:
    request = sft_request("cli-refused")
    request[block] = {field: "/etc/x"}
    result = runner.invoke(app, ["validate", str(write(tmp_path, request))])
    assert result.exit_code == 2
    [line] = [line.strip() for line in result.output.splitlines() if line.strip().startswith(f"{block}.{field}:")]
    assert all(name in line for name in names), line


def test_schema_prints_every_schema() -> None:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    assert set(json.loads(result.output)) == {"request.schema.json", "event.schema.json", "control.schema.json"}


async def test_submit_publishes_keyed_by_request_id(settings: Settings, tmp_path: Path) -> None:
    path = write(tmp_path, sft_request("cli-submit"))
    env = settings_environment(settings)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon.cli.app", "submit", str(path), env=env, stdout=asyncio.subprocess.PIPE
    )
    stdout, _ = await process.communicate()
    assert process.returncode == 0
    assert f"submitted cli-submit to {settings.requests_topic}[0]@0" in stdout.decode()
    [record] = await read_records(settings, settings.requests_topic, 1)
    assert record.key == b"cli-submit"
    assert json.loads(record.value)["request_id"] == "cli-submit"


def test_run_refuses_bad_settings_with_their_names(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("job_slots = -1\n")
    result = subprocess.run([sys.executable, "-m", "daemon.cli.app", "run", "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "job_slots" in result.stderr


def test_methods_lists_what_this_trl_can_run() -> None:
    result = runner.invoke(app, ["methods"])
    assert result.exit_code == 0
    lines = {line.split()[0]: line for line in result.output.splitlines()[1:]}
    assert set(lines) == {"sft", "dpo", "kto", "reward", "grpo", "rloo", "distillation", "orpo", "cpo", "gkd", "online_dpo", "ppo"}
    assert "available" in lines["sft"] and "available" in lines["distillation"]
    assert all("experimental" in lines[name] for name in ("orpo", "cpo", "gkd", "online_dpo"))
    assert "unavailable: method ppo needs trl>=1.10,<1.13" in lines["ppo"]
