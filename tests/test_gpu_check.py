"""benchmarks/gpu_check.py's plan: which rows a host runs and which it skips, and that the script's
`--plan` mode runs here (nothing trained, no broker started)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.gpu_check import CHECKS, Host, plan
from benchmarks.gpu_jobs import QWEN2_05B, long_rows, sft_request

ROOT = Path(__file__).parents[1]


def skipped(host: Host) -> dict[str, str | None]:
    return {check.name: skip for check, skip in plan(host)}


def test_cpu_host_runs_the_daemon_and_fork_server_rows_and_skips_the_gpu_rows() -> None:
    rows = skipped(Host(cuda=False, vllm=False, bitsandbytes=True))
    assert rows == {
        "sft": None,
        "qlora": "skipped (no CUDA)",
        "memory": "skipped (no CUDA)",
        "warm": None,
        "grpo_vllm": "skipped (no CUDA)",
    }


def test_gpu_host_skips_only_what_is_not_installed() -> None:
    assert set(skipped(Host(cuda=True, vllm=True, bitsandbytes=True)).values()) == {None}
    rows = skipped(Host(cuda=True, vllm=False, bitsandbytes=True))
    assert rows["grpo_vllm"] == "skipped (vLLM not installed)"
    assert [name for name, skip in rows.items() if skip is None] == ["sft", "qlora", "memory", "warm"]


def test_every_check_has_a_target_and_a_unique_name() -> None:
    assert len({check.name for check in CHECKS}) == len(CHECKS)
    assert all(check.target for check in CHECKS)


def test_the_gpu_requests_are_valid_requests_of_a_05b_shaped_model(tmp_path: Path) -> None:
    from schemas.request import REQUEST_MODELS

    assert (QWEN2_05B["hidden_size"], QWEN2_05B["num_hidden_layers"], QWEN2_05B["num_attention_heads"], QWEN2_05B["num_key_value_heads"]) == (896, 24, 14, 2)
    request = sft_request(tmp_path, "gpu-qlora", 5, long_rows(4), quantization="4bit")
    parsed = REQUEST_MODELS["sft"].model_validate(request)
    assert (parsed.model.quantization, parsed.model.dtype) == ("4bit", "bfloat16")


def test_the_gpu_check_grpo_request_is_valid(tmp_path: Path) -> None:
    from benchmarks.gpu_jobs import grpo_request
    from schemas.request import REQUEST_MODELS

    parsed = REQUEST_MODELS["grpo"].model_validate(grpo_request(tmp_path, "gpu-grpo", 2))
    assert parsed.set_fields("grpo")["vllm_mode"] == "colocate"


def test_plan_mode_lists_every_row_and_trains_nothing(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--plan", "--cpu", "--results", str(tmp_path)],
                         cwd=ROOT, check=True, capture_output=True, text=True, timeout=120).stdout
    assert "CPU mode (GPU rows skipped)" in out
    for check in CHECKS:
        assert check.title in out
    assert out.count("skipped (no CUDA)") == 3
    assert not list(tmp_path.iterdir())  # --plan writes no results
