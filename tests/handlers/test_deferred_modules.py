"""A job that does not need bitsandbytes never runs it, in a child forked as the fork server forks
one (issue 52): the server imports it in name only (it initialises CUDA at import), and once the
child has read its job, `deferred.settle` leaves it deferred for a job that needs it (a quantized
model, a bitsandbytes optimizer) and absent for any other, so peft's LoRA dispatch, which runs it
whenever it looks installed, does not. mlflow and boto3, imported in name only because only
some jobs use them, stay deferred through a job that does not, and run at their
first use. Deterministic: what is in the child's `sys.modules` and
mapped in its memory, not how long it took."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers.trainer_optimizer import _BITSANDBYTES_OPTIMIZERS

from handlers.toolkit import deferred
from schemas.request import REQUEST_MODELS
from schemas.trl_fields import TrainingArgumentsFields
from testbed.data import CHAT_ROWS
from tests.helpers import sft_request

ROOT = Path(__file__).parents[2]

# The fork server's set-up, then a fork: the child reads its job, settles, and runs the LoRA job whole.
SERVER_THEN_JOB = """
import json, os, sys
from pathlib import Path
os.environ["ADAPTERD_FORK_FD"] = "-1"  # what makes this interpreter the fork server, for deferred.defer_in_fork_server
from handlers.toolkit import deferred
deferred.defer_in_fork_server()  # what the server's main does first
from handlers.methods import HANDLERS  # what it imports
import schemas
from tests.helpers import run_handler

request, work = json.loads(sys.argv[1]), Path(sys.argv[2])
server = deferred.pending()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    deferred.stop_deferring()  # what forkserver.fork_child does
    absent = deferred.settle(deferred.needed_by(schemas.REQUEST_MODELS[request["method"]].model_validate(request)))  # what runner.main does once the job is read
    result, _ = run_handler(request, work)
    seen = {"absent": absent, "result": type(result).__name__, "adapter": (work / "artifact" / "adapter_config.json").is_file(),
            "pending": deferred.pending(), "in_sys_modules": repr(sys.modules.get("bitsandbytes", "missing")),
            "ran": sorted(name for name in sys.modules if name.split(".")[0] in deferred.DEFERRED and "." in name),
            "native": sorted({line.split("/")[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "libbitsandbytes" in line})}
    import trl.extras.profiling  # holds `mlflow`, imported in name only in the server
    trl.extras.profiling.mlflow.active_run  # a tracker's first use, as a job reporting to it makes: it runs now
    import mlflow
    seen["tracker_ran"] = "mlflow.tracking" in sys.modules and sys.modules["mlflow"] is mlflow and mlflow.active_run is trl.extras.profiling.mlflow.active_run
    os.write(write, json.dumps(seen).encode())
    os._exit(0)
os.close(write)
child = json.loads(os.read(read, 65536))
os.waitpid(pid, 0)
print(json.dumps({"server": server, "child": child}))
"""  # noqa: E501 (a script's text, run as written)


@pytest.mark.slow
def test_a_lora_job_in_a_forked_child_leaves_the_deferred_modules_unrun(tiny_model_dir: Path, tmp_path: Path) -> None:
    request = sft_request(
        "deferred-lora", model={"id": str(tiny_model_dir)}, dataset={"rows": CHAT_ROWS}, sft={"max_length": 64}
    )
    assert request["peft"] is not None  # a LoRA job: peft.get_peft_model builds its model
    out = subprocess.run(
        [sys.executable, "-c", SERVER_THEN_JOB, json.dumps(request), str(tmp_path / "job")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # Imported in name only by peft, transformers, TRL and accelerate, as on a GPU host.
    assert seen["server"] == sorted(deferred.DEFERRED) == ["bitsandbytes", "boto3", "mlflow"]
    child = seen["child"]
    assert child["result"] == "TrainResult" and child["adapter"]  # the LoRA job trained and saved its adapter
    # None of the deferred modules' code ran, nor bitsandbytes' native library loaded: it was left out for the job.
    assert child["ran"] == [] and child["native"] == []
    assert child["absent"] == ["bitsandbytes"] and child["in_sys_modules"] == "None"
    assert child["pending"] == ["boto3", "mlflow"]  # they stay deferred: a job reporting to MLflow runs them
    assert child["tracker_ran"]


def request_of(**overrides: object) -> object:
    request = sft_request("deferred", dataset={"rows": CHAT_ROWS}, **overrides)
    return REQUEST_MODELS["sft"].model_validate(request)


def test_only_a_quantized_model_or_a_bitsandbytes_optimizer_needs_bitsandbytes() -> None:
    assert deferred.needed_by(request_of()) == frozenset()  # type: ignore[arg-type]
    assert deferred.needed_by(request_of(training={"optim": "adamw_torch"})) == frozenset()  # type: ignore[arg-type]
    for quantization in ("4bit", "8bit"):
        assert deferred.needed_by(request_of(model={"id": "tiny/qwen2-chat", "quantization": quantization})) == {
            "bitsandbytes"
        }  # type: ignore[arg-type]
    for optim in ("adamw_bnb_8bit", "paged_adamw_8bit", "lion_32bit", "galore_adamw_8bit"):
        assert deferred.needed_by(request_of(training={"optim": optim})) == {"bitsandbytes"}  # type: ignore[arg-type]


def test_the_bitsandbytes_optimizers_are_transformers_own_and_accepted_by_the_schema() -> None:
    # transformers' list of the optimizers it builds from bitsandbytes (a private name: read here only as the oracle).
    assert {str(name.value) for name in _BITSANDBYTES_OPTIMIZERS} <= deferred.BITSANDBYTES_OPTIMIZERS
    accepted = set(TrainingArgumentsFields.model_fields["optim"].annotation.__args__)  # type: ignore[union-attr]
    assert deferred.BITSANDBYTES_OPTIMIZERS <= accepted


def test_settle_keeps_a_needed_module_deferred_and_makes_any_other_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two stand-in deferred modules (no import runs): what settle does with each, by what the job needs.
    from importlib.machinery import ModuleSpec

    class Real:
        pass

    for name in ("stand_in_needed", "stand_in_unneeded"):
        spec = ModuleSpec(name, deferred.DeferringLoader(Real()))  # type: ignore[arg-type]
        module = deferred.DeferringLoader(Real()).create_module(spec)  # type: ignore[arg-type]
        monkeypatch.setitem(sys.modules, name, module)
    assert {"stand_in_needed", "stand_in_unneeded"} <= set(deferred.pending())
    absent = deferred.settle({"stand_in_needed"}, withheld={"stand_in_needed", "stand_in_unneeded"})
    assert "stand_in_unneeded" in absent and "stand_in_needed" not in absent
    assert sys.modules["stand_in_unneeded"] is None and "stand_in_needed" in deferred.pending()
    with pytest.raises(ModuleNotFoundError):
        __import__("stand_in_unneeded")
    import importlib.util

    assert importlib.util.find_spec("stand_in_unneeded") is None  # what every library's availability check asks


def test_a_module_deferred_for_time_only_is_never_made_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.machinery import ModuleSpec

    class Real:
        pass

    spec = ModuleSpec("mlflow_stand_in", deferred.DeferringLoader(Real()))  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "mlflow_stand_in", deferred.DeferringLoader(Real()).create_module(spec))  # type: ignore[arg-type]
    absent = deferred.settle(set())  # a job that needs nothing
    assert (
        "mlflow_stand_in" not in absent and "mlflow_stand_in" in deferred.pending()
    )  # only CUDA_AT_IMPORT's are withheld


def test_importing_the_methods_defers_only_while_it_runs() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\nfrom handlers.toolkit import deferred\nfrom handlers.methods import HANDLERS\n"
            "print(deferred.pending(), deferred._finder is None, 'mlflow.tracking' in sys.modules, "
            "'bitsandbytes.nn' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "['bitsandbytes', 'boto3', 'mlflow'] True False False"


def test_a_deferred_module_runs_with_the_hub_offline_for_kernels_unless_the_operator_allows_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bitsandbytes' CPU backend asks the Hub for a kernel when it is imported (transformers 5.25 installs `kernels`):
    a deferred module's code runs with huggingface_hub's offline flag set (what `kernels.get_kernel` reads), unless
    USE_HUB_KERNELS says yes; the flag is set back after. Constructed: a module that records what it saw."""
    from huggingface_hub import constants

    (tmp_path / "kernel_fetcher.py").write_text(
        "from huggingface_hub import constants\nSAW = constants.HF_HUB_OFFLINE\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # a host online (the suite's own setting aside)
    for allowed, saw in (("", True), ("NO", True), ("YES", False)):
        monkeypatch.setenv("USE_HUB_KERNELS", allowed)
        finder = deferred.DeferringFinder(["kernel_fetcher"])
        sys.meta_path.insert(0, finder)
        try:
            import kernel_fetcher  # type: ignore[import-not-found]  # in name only: nothing ran yet

            assert isinstance(kernel_fetcher, deferred.DeferredModule)
            assert kernel_fetcher.SAW is saw, allowed  # its code ran at this first use
        finally:
            sys.meta_path.remove(finder)
            sys.modules.pop("kernel_fetcher", None)
        assert constants.HF_HUB_OFFLINE is False  # set back
