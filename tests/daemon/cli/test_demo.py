"""`adapterd demo` as a newcomer runs it: readable output, no terminal escape codes, no ERROR line on a
healthy run, and an adapter at the printed path that the printed Python snippet loads."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.admission.capabilities import available_methods
from schemas import TERMINAL_TYPES
from tests.helpers import assert_adapter_trained


def demo(*args: str, home: Path, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTERD_") or k == "ADAPTERD_KAFKA_JARS"}
    environment.update(HF_HOME=str(home / "hf-home"), HF_HUB_OFFLINE="1")  # the demo needs no network
    return subprocess.run(
        [sys.executable, "-m", "daemon.cli.app", "demo", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_an_unknown_method_exits_2_naming_the_available_ones(tmp_path: Path) -> None:
    result = demo("--method", "nonsense", "--work-dir", str(tmp_path / "demo"), home=tmp_path, timeout_s=120)
    assert result.returncode == 2
    assert "unknown method 'nonsense'" in result.stderr
    assert f"this host can run: {', '.join(available_methods())}" in result.stderr
    assert not (tmp_path / "demo").exists()  # nothing was started


@pytest.mark.slow
def test_the_gate_demo_publishes_the_adapter_that_passes_and_the_nan_one_into_a_pull_request(tmp_path: Path) -> None:
    result = demo("--gate", "--work-dir", str(tmp_path / "demo"), home=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    outputs = tmp_path / "demo" / "outputs" / "demo"
    main = outputs / "tiny-sft-gated-adapter"
    [pull] = outputs.glob("tiny-sft-gated-adapter#demo-sft-*-fails")  # <repo name>#<request id>
    assert (
        "gate pass, published to main (main)" in result.stderr
        and f"gate fail, published to pr (pr/{pull.name.split('#')[1]})" in result.stderr
    )
    # All 10 steps of the run on the NaN model, on one line: event lines are not wrapped off a terminal.
    assert "  failed: every logged training loss finite: 10 logged losses were NaN or infinite" in result.stderr
    assert (
        f"passed its gate is in {main} (main)" in result.stdout and f"is in the pull request {pull}," in result.stdout
    )
    assert (
        "gate verdict: **pass**" in (main / "README.md").read_text()
        and "gate verdict: **fail**" in (pull / "README.md").read_text()
    )
    assert sorted(p.name for p in outputs.iterdir()) == [main.name, pull.name]  # nothing else was published
    assert "\x1b" not in output


def test_a_method_in_capitals_or_mistyped_is_named_with_the_one_meant() -> None:
    from daemon.cli.demo import method_problem

    assert "unknown method 'SFT' (did you mean 'sft'?)" in (method_problem("SFT") or "")
    assert "(did you mean 'grpo'?)" in (method_problem("gpro") or "")
    assert "did you mean" not in (method_problem("nonsense") or "")


def test_the_gate_demo_is_the_sft_demo(tmp_path: Path) -> None:
    result = demo("--gate", "--method", "dpo", "--work-dir", str(tmp_path / "demo"), home=tmp_path, timeout_s=120)
    assert result.returncode == 2 and "--gate shows the sft demo" in result.stderr


@pytest.mark.slow
def test_the_readmes_demo_runs_to_succeeded_reads_cleanly_and_leaves_an_adapter_the_snippet_loads(
    tmp_path: Path,
) -> None:
    """The README's main command as written (`adapterd demo`, built-in defaults, SFT) on a fresh work
    dir and with no network: its lifecycle and progress bar, no escape codes or error lines, and the
    three lines it prints load the adapter it trained. (Each method's training through the daemon is
    tests/handlers' to show.)"""
    result = demo("--work-dir", str(tmp_path / "demo"), home=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    events = [
        word
        for line in result.stderr.splitlines()
        for word in line.split()[2:3]
        if word in TERMINAL_TYPES | {"accepted", "started"}
    ]
    assert events == ["accepted", "started", "succeeded"], result.stderr
    assert re.search(r"training, loss \d+\.\d+ .* 10/10", result.stderr), result.stderr  # the progress bar
    assert "\x1b" not in output
    assert not [line for line in output.splitlines() if "ERROR" in line or "[error" in line], output
    assert re.search(r"succeeded on .*", output) and "loss " in output, output

    [adapter] = re.findall(r"^the adapter is in (.+)$", result.stdout, re.MULTILINE)
    adapter_dir = Path(adapter)
    assert adapter_dir == tmp_path / "demo" / "outputs" / "demo" / "tiny-sft-adapter"
    assert (adapter_dir / "adapter_model.safetensors").stat().st_size > 0
    assert "library_name: peft" in (adapter_dir / "README.md").read_text()
    snippet = result.stdout[result.stdout.index("from peft import PeftModel") :]
    namespace: dict[str, object] = {}
    exec(snippet, namespace)  # the three lines the demo tells a newcomer to run
    assert type(namespace["model"]).__name__ == "PeftModelForCausalLM"
    assert_adapter_trained(adapter_dir, tmp_path / "demo" / "tiny-model")


@pytest.mark.parametrize("name", ["sft-vision", "dpo-vision", "grpo-vision"])
def test_the_vision_demos_requests_pass_intake(name: str, tmp_path: Path) -> None:
    from daemon.admission.images import inline_image_errors
    from daemon.cli.demo import method_problem
    from daemon.cli.demo.requests import demo_request
    from schemas.images import ImageBounds

    request = demo_request(name, tmp_path / "tiny-vlm")
    assert request.method == name.removesuffix("-vision") and request.dataset.rows is not None
    assert inline_image_errors(request, ImageBounds()) == []
    assert method_problem(name) is None


def test_the_math_demo_trains_grpo_on_sums_with_trls_accuracy_reward(tmp_path: Path) -> None:
    from daemon.cli.demo import method_problem
    from daemon.cli.demo.requests import MATH_ROWS, demo_request

    request = demo_request("grpo-math", tmp_path / "tiny-model")
    assert request.method == "grpo" and request.dataset.rows == MATH_ROWS and len(MATH_ROWS) >= 8
    assert [(f.name, getattr(f, "column", None)) for f in request.rewards.functions][0] == ("accuracy", "solution")
    assert all(
        row["solution"] == f"${sum(int(n) for n in re.findall(r'[0-9]+', row['prompt']))}$" for row in MATH_ROWS
    )  # the sums are right
    assert method_problem("grpo-math") is None


# The kept demo (`--keep`), driven as a person drives it, is tests/daemon/cli/test_demo_tour.py's.


def test_the_kept_demos_commands_are_uv_run_in_a_checkout_and_bare_where_installed(tmp_path: Path) -> None:
    from daemon.cli.demo.keep import project_folder, tour

    assert project_folder() == Path(__file__).resolve().parents[3]  # this checkout
    config, request = tmp_path / "adapterd.toml", tmp_path / "request.json"
    in_checkout, installed = tour(config, request, "r-again"), tour(config, request, "r-again", in_project=False)
    assert [line.split()[3] for line in in_checkout] == [
        "submit",
        "jobs",
        "get",
        "logs",
        "status",
        "doctor",
        "events",
        "cancel",
    ]
    assert all(line.startswith("uv run adapterd ") and line.endswith(f" -c {config}") for line in in_checkout)
    assert [line.removeprefix("uv run ") for line in in_checkout] == installed


def test_the_kept_demos_settings_file_holds_its_endpoint_and_logs_token_for_its_owner_only(tmp_path: Path) -> None:
    import tomllib

    from daemon.cli.demo.keep import keep_running_config
    from daemon.settings import Settings

    settings = Settings(
        bootstrap_servers="127.0.0.1:1234",
        work_dir=tmp_path,
        metrics_address="127.0.0.1:5678",
        logs_token="t" * 43,
        allowed_local_model_roots=[tmp_path],
        group_id="adapterd-demo",
    )
    path = keep_running_config(settings)
    written = tomllib.loads(path.read_text())
    assert written == {
        "bootstrap_servers": "127.0.0.1:1234",
        "work_dir": str(tmp_path),
        "allowed_local_model_roots": [str(tmp_path)],
        "group_id": "adapterd-demo",
        "metrics_address": "127.0.0.1:5678",
        "logs_token": "t" * 43,
    }
    assert path.stat().st_mode & 0o777 == 0o600
