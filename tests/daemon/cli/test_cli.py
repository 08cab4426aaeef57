"""The `adapterd` command line, as users call it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    request["training"] = {"learning_rat": 1e-5}
    result = runner.invoke(app, ["validate", str(write(tmp_path, request))])
    assert result.exit_code == 1  # the request failed the check; 2 is for usage errors
    assert "peft.r:" in result.output and "peft.alpha: unknown field" in result.output
    assert (
        "training.learning_rat: unknown field; not part of schema version 1; did you mean 'learning_rate'?"
        in result.output
    )


@pytest.mark.parametrize(
    ("block", "field", "names"),
    [
        (
            "training",
            "output_dir",
            ("transformers.TrainingArguments.output_dir", "set by the daemon", "the job's folder"),
        ),
        (
            "sft",
            "chat_template_path",
            ("trl.SFTConfig.chat_template_path", "a path or address on the host", "use model.chat_template"),
        ),
        ("peft", "task_type", ("peft.LoraConfig.task_type", "set by the daemon", "the method decides it")),
    ],
)
def test_validate_names_a_refused_trl_field_and_why(
    tmp_path: Path, block: str, field: str, names: tuple[str, ...]
) -> None:
    request = sft_request("cli-refused")
    request[block] = {field: "/etc/x"}
    result = runner.invoke(app, ["validate", str(write(tmp_path, request))])
    assert result.exit_code == 1
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
    result = subprocess.run(
        [sys.executable, "-m", "daemon.cli.app", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "job_slots" in result.stderr


def test_methods_lists_what_this_trl_can_run() -> None:
    result = runner.invoke(app, ["methods"])
    assert result.exit_code == 0
    assert result.output.splitlines()[1].split() == ["METHOD", "TRAINER", "STATUS", "HERE"]
    lines = {line.split()[0]: line for line in result.output.splitlines()[2:]}
    assert set(lines) == {
        "sft",
        "dpo",
        "kto",
        "reward",
        "grpo",
        "rloo",
        "distillation",
        "orpo",
        "cpo",
        "gkd",
        "online_dpo",
        "ppo",
    }
    assert "available" in lines["sft"] and "available" in lines["distillation"]
    assert all("experimental" in lines[name] for name in ("orpo", "cpo", "gkd", "online_dpo"))
    assert "unavailable: method ppo needs trl>=1.10,<1.13" in lines["ppo"]


def test_version() -> None:
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"adapterd {version('adapterd')}"


def test_a_request_file_that_is_not_there_is_a_usage_error_without_a_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "daemon.cli.app", "validate", str(tmp_path / "missing.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_validate_with_a_hosts_settings_judges_the_request_as_its_daemon_would(tmp_path: Path) -> None:
    host = tmp_path / "host.toml"
    host.write_text(f'allowed_local_model_roots = ["{tmp_path / "models"}"]\n')
    outside = write(tmp_path, sft_request("cli-host", model={"id": "/etc/models/x"}))
    result = runner.invoke(app, ["validate", str(outside), "--config", str(host)])
    assert (
        result.exit_code == 1
        and "model.id: local path /etc/models/x is outside allowed_local_model_roots" in result.output
    )
    inside = write(tmp_path, sft_request("cli-host", model={"id": str(tmp_path / "models" / "x")}))
    result = runner.invoke(app, ["validate", str(inside), "--config", str(host)])
    assert result.exit_code == 0 and f"and {host} would take it" in result.output, result.output
    assert runner.invoke(app, ["validate", str(inside)]).exit_code == 0  # without --config: the schema alone


@pytest.mark.parametrize("which", ["request", "event", "control"])
def test_schema_prints_the_one_asked_for(which: str) -> None:
    result = runner.invoke(app, ["schema", which])
    assert result.exit_code == 0 and json.loads(result.output)["$id"].endswith(f"/{which}.schema.json")


@pytest.mark.parametrize(
    "command",
    [
        ["cancel", "some-request"],
        ["events"],
        ["topics"],
        ["submit", "REQUEST"],
        ["jobs"],
        ["get", "some-request"],
        ["usage"],
        ["submit", "REQUEST", "--wait"],
    ],
)
def test_a_broker_that_does_not_answer_is_one_line_and_exit_1(command: list[str], tmp_path: Path) -> None:
    request = write(tmp_path, sft_request("cli-nobroker"))
    config = tmp_path / "host.toml"
    config.write_text('bootstrap_servers = "127.0.0.1:9"\n')  # the discard port: nothing listens there
    argv = [str(request) if part == "REQUEST" else part for part in command]
    result = subprocess.run(
        [sys.executable, "-m", "daemon.cli.app", *argv, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    # One line, naming the settings file it read; no client left open, no aiokafka line of its own (issue 49).
    [line] = result.stderr.splitlines()
    assert line.startswith(f"adapterd: Kafka at 127.0.0.1:9 (settings: {config} (--config)): KafkaConnectionError"), (
        line
    )
    assert "Unclosed" not in result.stderr and "object at 0x" not in result.stderr


def test_settings_are_found_in_adapterd_config_then_the_current_folder_then_etc(tmp_path: Path) -> None:
    """Without --config: $ADAPTERD_CONFIG, then ./adapterd.toml, then /etc/adapterd/adapterd.toml, and
    the line that says a broker does not answer names the one read (issue 49)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTERD_")}
    here = tmp_path / "project"
    here.mkdir()
    (here / "adapterd.toml").write_text('bootstrap_servers = "127.0.0.1:9"\n')
    named = tmp_path / "named.toml"
    named.write_text('bootstrap_servers = "127.0.0.1:7"\n')

    def jobs(**extra: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "daemon.cli.app", "jobs"],
            cwd=here,
            env=environment | extra,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 1, result.stderr
        return result.stderr

    assert f"Kafka at 127.0.0.1:9 (settings: {here / 'adapterd.toml'}):" in jobs()
    assert f"Kafka at 127.0.0.1:7 (settings: {named} (from ADAPTERD_CONFIG)):" in jobs(ADAPTERD_CONFIG=str(named))


def test_the_hosts_settings_file_is_read_when_no_other_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from daemon import settings as settings_module

    host = tmp_path / "etc-adapterd.toml"
    host.write_text("job_slots = 3\n")
    monkeypatch.delenv("ADAPTERD_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)  # no adapterd.toml here
    monkeypatch.setattr(settings_module, "SYSTEM_CONFIG", host)
    assert settings_module.find_config() == (host, str(host))
    assert settings_module.load_settings().job_slots == 3
    (tmp_path / "adapterd.toml").write_text("job_slots = 2\n")  # the current folder's comes first
    assert settings_module.load_settings().job_slots == 2
    monkeypatch.setattr(settings_module, "SYSTEM_CONFIG", tmp_path / "none.toml")
    (tmp_path / "adapterd.toml").unlink()
    assert (
        settings_module.find_config()[0] is None and settings_module.load_settings().job_slots == Settings().job_slots
    )


def test_methods_table_is_aligned() -> None:
    """Every column starts at the same place on every row, whatever the longest method's name (issue 49)."""
    lines = runner.invoke(app, ["methods"]).output.splitlines()[2:]  # the TRL's version, the header
    for column in ("trl.", "stable", "experimental"):
        starts = {line.index(column) for line in lines if column in line}
        assert len(starts) == 1, (column, lines)
    assert (
        len({line.index("available") if "unavailable" not in line else line.index("unavailable") for line in lines})
        == 1
    )


@pytest.mark.parametrize(
    ("events", "sends", "says"),
    [
        ([], True, "x: never seen (no host published an event of it); the cancel is sent to adapterd.control"),
        (
            ["accepted"],
            True,
            "x: queued on vm; the cancel is sent to adapterd.control: the request is skipped when it is reached",
        ),
        (
            ["accepted", "started", "progress"],
            True,
            "x: running on vm (attempt 1); the cancel is sent to adapterd.control: that host stops the job",
        ),
        (
            ["accepted", "started", "succeeded"],
            False,
            "x: already succeeded on vm (attempt 1); nothing to cancel, nothing sent",
        ),
        (["accepted", "started", "failed"], False, "x: already failed on vm"),
        (["accepted", "cancelled"], False, "x: already cancelled on vm"),
        (["rejected"], False, "x: already rejected on vm"),
    ],
)
def test_cancel_says_what_it_knows_of_the_request_and_what_will_happen(
    events: list[str], sends: bool, says: str
) -> None:
    """What `adapterd cancel` decides from the request's events (issue 49): a request that ended is
    left, nothing sent; a running or queued one is cancelled, said how; one never seen is sent and said so."""
    from daemon.cli.cancel import plan
    from daemon.cli.jobs import fold
    from schemas import parse_event
    from tests.helpers import event_document

    folded = fold(
        parse_event(json.dumps(event_document(kind, request_id="x", host="vm", attempt=1)).encode()) for kind in events
    )
    decided = plan("x", folded.get("x"), "adapterd.control")
    assert decided.send is sends and decided.said.startswith(says), decided.said


def test_doctor_with_no_broker_says_it_once_in_its_own_words(tmp_path: Path) -> None:
    config = tmp_path / "host.toml"
    config.write_text(f'bootstrap_servers = "127.0.0.1:9"\nmetrics_address = ""\nwork_dir = "{tmp_path}"\n')
    result = subprocess.run(
        [sys.executable, "-m", "daemon.cli.app", "doctor", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert (
        result.stdout.startswith("FAIL kafka   no broker answers at 127.0.0.1:9: ")
        and "Unable connect" not in result.stderr
    ), result.stderr
    assert "Unclosed" not in result.stderr and "Traceback" not in result.stderr


def test_validate_with_a_hosts_settings_says_its_memory_plan_sharded_whole_or_rejected(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`validate -c` plans the job as the host's daemon would (daemon/resources/shards.py), its model's headers read
    from the allowed local folder: the host's GPU memory is set between the tiny model's figures for a whole copy and
    a shard across two GPUs, below both, and above both."""
    from daemon.resources.estimator import Estimator, MemoryHistory
    from schemas import RequestBase, decode_request

    body = sft_request(
        "cli-plan", model={"id": str(tiny_model_dir), "dtype": "float32"}, peft=None, resources={"gpus": 2}
    )
    estimator = Estimator(Settings(hub_token=None), MemoryHistory(tmp_path / "none.json"))
    request = decode_request(json.dumps(body).encode())
    assert isinstance(request, RequestBase), request
    whole = asyncio.run(estimator.need(request))
    sharded = estimator.known(request, shards=2)[1]
    assert whole is not None and sharded is not None and sharded.needed < whole.needed
    path = write(tmp_path, body)

    def validate(room: int) -> Any:
        host = tmp_path / f"host-{room}.toml"
        host.write_text(
            f'allowed_local_model_roots = ["{tiny_model_dir.parent}"]\ngpus = ["0", "1"]\n'
            f'gpu_memory_bytes = {room}\ngpu_memory_headroom = 0.0\nwork_dir = "{tmp_path / "work"}"\n'
        )
        return runner.invoke(app, ["validate", str(path), "--config", str(host)])

    between = validate((whole.needed + sharded.needed) // 2)
    assert between.exit_code == 0 and "would take it: sharded across its 2 GPUs" in between.output, between.output
    above = validate(whole.needed + 1)
    assert above.exit_code == 0 and "would take it: a whole copy on each of its GPUs" in above.output, above.output
    below = validate(sharded.needed - 1)
    assert below.exit_code == 1 and "resources.gpus: its memory estimate is" in below.output, below.output
