"""benchmarks/gpu_check.py, the one GPU check: which rows a host runs and which it skips, its `--plan`
with no JVM on the PATH (what the bare GPU machine has), and its CPU mode end to end there, the
daemon's own packing included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_check import CHECKS, Host, plan
from benchmarks.gpu_jobs import QWEN2_05B, long_rows, sft_request

ROOT = Path(__file__).parents[1]


def skipped(host: Host, only: set[str] | None = None) -> dict[str, str | None]:
    return {check.name: skip for check, skip in plan(host, only)}


def no_jvm(tmp_path: Path) -> dict[str, str]:
    """The environment of a bare GPU machine, as far as the PATH goes: no java, no uv, no broker."""
    empty = tmp_path / "empty-path"
    empty.mkdir(exist_ok=True)
    return {**os.environ, "PATH": str(empty)}


def test_cpu_host_runs_the_daemon_fork_server_packing_and_method_rows_and_skips_the_gpu_rows() -> None:
    rows = skipped(Host(cuda=False, vllm=False, bitsandbytes=True))
    assert rows["sharded"] == "skipped (no CUDA)"
    assert [name for name, skip in rows.items() if skip is None] == ["warm", "sft", "packing", "methods"]
    assert {skip for skip in rows.values() if skip is not None} == {"skipped (no CUDA)"}


def test_gpu_host_skips_only_what_is_not_installed() -> None:
    assert set(skipped(Host(cuda=True, vllm=True, bitsandbytes=True, gpus=2)).values()) == {None}
    rows = skipped(Host(cuda=True, vllm=False, bitsandbytes=False, gpus=2))
    assert (
        rows["grpo_vllm"] == "skipped (vLLM not installed)" and rows["qlora"] == "skipped (bitsandbytes not installed)"
    )
    assert [name for name, skip in rows.items() if skip is not None] == ["qlora", "grpo_vllm"]


def test_a_host_of_one_gpu_skips_the_sharded_row_alone_saying_so() -> None:
    rows = skipped(Host(cuda=True, vllm=True, bitsandbytes=True, gpus=1))
    assert {name: skip for name, skip in rows.items() if skip is not None} == {"sharded": "skipped: one GPU"}


def test_the_sharded_rows_model_fits_no_80_gb_gpu_whole_and_two_sharded(tmp_path: Path) -> None:
    """The sharded row's job (benchmarks/gpu_jobs.py `sharded_request`, a full fine-tune of Qwen2.5-7B's shape): the
    estimate of its whole copy is over an 80 GB GPU's room, so the daemon's plan shards it (daemon/resources/shards.py),
    and its figure a GPU across two fits."""
    from benchmarks.gpu_jobs import QWEN2_7B, sharded_request
    from benchmarks.what_fits import ROOM, Shape
    from daemon.resources.memory import estimate
    from schemas.request import REQUEST_MODELS

    config = {key: int(value) for key, value in QWEN2_7B.items()}
    shape = Shape(
        "qwen7b",
        hidden=config["hidden_size"],
        layers=config["num_hidden_layers"],
        mlp=config["intermediate_size"],
        kv=config["num_key_value_heads"] * config["hidden_size"] // config["num_attention_heads"],
        vocab=config["vocab_size"],
        tied=bool(config["tie_word_embeddings"]),
    )
    request = REQUEST_MODELS["sft"].model_validate(sharded_request(tmp_path, "gpu-sharded", 5, long_rows(4), gpus=2))
    assert (request.peft, request.resources.gpus, request.resources.shard) == (None, 2, "auto")
    whole, sharded = estimate(request, shape.tensors()), estimate(request, shape.tensors(), shards=2)
    assert whole.needed > ROOM > sharded.needed, (whole.needed / 2**30, sharded.needed / 2**30, ROOM / 2**30)


def test_only_runs_the_rows_asked_for() -> None:
    rows = skipped(Host(cuda=True, vllm=True, bitsandbytes=True), {"packing", "lora_7b"})
    assert [name for name, skip in rows.items() if skip is None] == ["packing", "lora_7b"]
    assert rows["sft"] == "not asked (--only)"


def test_every_check_has_a_target_and_a_unique_name_and_a_way_to_run() -> None:
    from benchmarks.gpu_check import row_functions

    assert len({check.name for check in CHECKS}) == len(CHECKS)
    assert all(check.target for check in CHECKS)
    assert {check.name for check in CHECKS} == {*row_functions(), "warm"}  # warm is read before and after the others


def test_the_gpu_requests_are_valid_requests_of_a_05b_shaped_model(tmp_path: Path) -> None:
    from schemas.request import REQUEST_MODELS

    assert (
        QWEN2_05B["hidden_size"],
        QWEN2_05B["num_hidden_layers"],
        QWEN2_05B["num_attention_heads"],
        QWEN2_05B["num_key_value_heads"],
    ) == (896, 24, 14, 2)
    request = sft_request(tmp_path, "gpu-qlora", 5, long_rows(4), quantization="4bit")
    parsed = REQUEST_MODELS["sft"].model_validate(request)
    assert (parsed.model.quantization, parsed.model.dtype) == ("4bit", "bfloat16")


def test_the_gpu_check_grpo_request_is_valid(tmp_path: Path) -> None:
    from benchmarks.gpu_jobs import grpo_request
    from schemas.request import REQUEST_MODELS

    parsed = REQUEST_MODELS["grpo"].model_validate(grpo_request(tmp_path, "gpu-grpo", 2))
    assert parsed.set_fields("grpo")["vllm_mode"] == "colocate"


def test_plan_lists_every_row_with_no_jvm_on_the_path_and_trains_nothing(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--plan", "--cpu", "--out", str(tmp_path / "out")],
        cwd=ROOT,
        env=no_jvm(tmp_path),
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "no GPU (CPU mode)" in out
    for check in CHECKS:
        assert f"| {check.name} | {check.title} |" in out
    assert "| packing | LoRA jobs at once on one GPU through max_jobs_per_gpu: aggregate tokens/s | runs |" in out
    assert "| lora_7b | a 7B-shaped LoRA job's share of the GPU's measured bf16 peak | skipped (no CUDA) |" in out
    assert out.count("skipped (no CUDA)") == 8
    assert not (tmp_path / "out").exists()  # --plan writes no results


def test_the_wheels_for_a_bare_gpu_machine_are_the_locks_versions() -> None:
    from benchmarks.gpu_wheels import LACKING, locked_versions, plan

    versions = locked_versions()
    wanted = dict(requirement.split("==") for requirement in plan(versions))
    assert set(wanted) == {*LACKING, "bitsandbytes"}
    assert all(wanted[name] == versions[name] for name in wanted)
    assert wanted["trl"] == versions["trl"] and "torch" not in wanted  # the machine's own torch stays


def test_bitsandbytes_is_trimmed_to_the_cpu_library_and_one_cuda_major(tmp_path: Path) -> None:
    import zipfile

    from benchmarks.gpu_wheels import trim_bitsandbytes

    names = [
        "bitsandbytes/__init__.py",
        "bitsandbytes/libbitsandbytes_cpu.so",
        "bitsandbytes/libbitsandbytes_cuda126.so",
        "bitsandbytes/libbitsandbytes_cuda130.so",
        "bitsandbytes/libbitsandbytes_cuda132.so",
        "bitsandbytes/libbitsandbytes_rocm70.so",
    ]
    with zipfile.ZipFile(tmp_path / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl", "w") as wheel:
        for name in names:
            wheel.writestr(name, b"x")
    kept = zipfile.ZipFile(trim_bitsandbytes(tmp_path, "13")).namelist()
    assert kept == [
        "bitsandbytes/__init__.py",
        "bitsandbytes/libbitsandbytes_cpu.so",
        "bitsandbytes/libbitsandbytes_cuda130.so",
        "bitsandbytes/libbitsandbytes_cuda132.so",
    ]
    assert not list(tmp_path.glob("*.whl"))  # the wheel itself is not carried as well


@pytest.mark.slow
def test_the_gpu_check_runs_in_cpu_mode_with_no_jvm_on_the_path_and_packs_through_the_daemon(tmp_path: Path) -> None:
    # What a bare GPU machine has: Python, no JVM, no broker. The daemon runs on Kafka in memory. The
    # warm and packing rows only (the daemon's fork server and its own packing): the others' code paths
    # are the same runner's, and each row trains for real, which on 2 cores costs a minute or more.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu_check",
            "--cpu",
            "--only",
            "warm,packing",
            "--steps",
            "2",
            "--root",
            str(tmp_path / "root"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=no_jvm(tmp_path),
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    table = (tmp_path / "out" / "gpu_check.md").read_text()
    rows = {
        cells[0]: cells[1:]
        for cells in (line.strip("| ").split(" | ") for line in table.splitlines() if line.startswith("| "))
    }
    assert rows["fork server before any job"][0] == "ready"
    assert rows["fork server after the jobs"][0] == "same server, CUDA untouched"
    # The daemon's own packing: the two jobs shared the one declared GPU at once.
    assert (
        "most jobs on one GPU at once (the daemon's slots): 1;"
        in rows["1 LoRA job(s) at once through max_jobs_per_gpu: aggregate tokens/s"][2]
    )
    assert (
        "most jobs on one GPU at once (the daemon's slots): 2;"
        in rows["2 LoRA job(s) at once through max_jobs_per_gpu: aggregate tokens/s"][2]
    )


def test_a_lora_tokens_flops_are_its_linear_layers_four_or_six_times() -> None:
    from benchmarks.gpu_jobs import QWEN2_7B, lora_flops_per_token

    per_token = lora_flops_per_token(QWEN2_7B, checkpointing=True)
    assert (
        6 * 7.0e9 < per_token < 6 * 7.7e9
    )  # Qwen2.5-7B: 7.6B parameters, of which the embedding (0.5B) does no matmul
    assert lora_flops_per_token(QWEN2_7B, checkpointing=False) == per_token * 4 // 6
