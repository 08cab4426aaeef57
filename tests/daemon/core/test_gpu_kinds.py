"""A host's kind of GPU (daemon/resources/kinds.py): made from what nvidia-smi says (samples of real cards' names and
totals), or named by the operator (`gpu_kind`), its memory the fleet's declared figure (`gpu_kinds`); a CPU host has
none; and the settings refuse a kind that is no kind's name."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from daemon.admission.gpu_kinds import GpuNeed, HostGpus, serves
from daemon.errors import ConfigError
from daemon.resources.kinds import detect, host_gpus, kind_of
from daemon.resources.slots import slots_of
from daemon.settings import Settings, load_settings

# `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits` as real cards print it.
SAMPLES = [
    ("NVIDIA H100 80GB HBM3", 81559, "h100-80gb"),
    ("NVIDIA H100 PCIe", 81559, "h100-80gb"),
    ("NVIDIA A100-SXM4-40GB", 40960, "a100-40gb"),
    ("NVIDIA A100 80GB PCIe", 81920, "a100-80gb"),
    ("NVIDIA L4", 23034, "l4-24gb"),
    ("Tesla T4", 15360, "t4-16gb"),
    ("NVIDIA H200", 143771, "h200-141gb"),
    ("NVIDIA GeForce RTX 4090", 24564, "rtx-4090-24gb"),
    ("NVIDIA RTX A6000", 49140, "rtx-a6000-48gb"),
    ("Tesla V100-SXM2-16GB", 16384, "v100-16gb"),
]


@pytest.mark.parametrize(("name", "mib", "kind"), SAMPLES, ids=[kind for _, _, kind in SAMPLES])
def test_a_cards_name_and_memory_make_its_kind(name: str, mib: int, kind: str) -> None:
    assert kind_of(name, mib) == kind


def test_the_hosts_gpus_kind_is_of_its_own_gpus_and_the_smallest_where_they_differ() -> None:
    listed = ["0, NVIDIA H100 80GB HBM3, 81559", "1, NVIDIA L4, 23034", "2, NVIDIA H100 80GB HBM3, 81559"]
    assert detect(["0", "2"], listed) == ("h100-80gb", 80.0)  # only the GPUs jobs may use (`gpus`)
    assert detect(["0", "1"], listed) == ("l4-24gb", 24.0)  # a job may be given either: the least of them
    assert detect(["0"], ["not, a line"]) is None
    assert detect(["0"], None) is None  # no nvidia-smi


def fake_nvidia_smi(folder: Path, lines: str) -> dict[str, str]:
    """A folder holding an `nvidia-smi` that prints `lines`, as the PATH of `host_gpus`' environment."""
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in lines.splitlines()))  # echo: a builtin
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {"PATH": str(folder)}


def test_detected_unless_the_operator_names_it_and_a_declared_kind_has_the_declared_memory(tmp_path: Path) -> None:
    environ = fake_nvidia_smi(tmp_path, "0, NVIDIA A100-SXM4-40GB, 40960\n1, NVIDIA A100-SXM4-40GB, 40960")
    assert host_gpus(Settings(), ["0", "1"], environ) == HostGpus("a100-40gb", 40.0, True)
    # Named by the operator: nvidia-smi's word is not taken; its memory is the fleet's declared figure.
    named = Settings(gpu_kind="a100-40gb-mig", gpu_kinds={"a100-40gb-mig": 20})
    assert host_gpus(named, ["0"], environ) == HostGpus("a100-40gb-mig", 20.0, True)
    # A name with no size and no declaration: the memory the operator gave, else unknown.
    assert host_gpus(Settings(gpu_kind="mystery", gpu_memory_bytes=48 * 2**30), ["0"], environ).memory_gib == 48.0
    assert host_gpus(Settings(gpu_kind="mystery"), ["0"], environ).memory_gib is None
    assert host_gpus(Settings(gpu_kind="h100-80gb"), [], environ) == HostGpus()  # a CPU host has no kind


def test_the_daemons_slots_carry_the_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    fake_nvidia_smi(tmp_path, "0, NVIDIA L4, 23034")
    assert slots_of(Settings(gpus=["0"])).kind == HostGpus("l4-24gb", 24.0, True)
    assert slots_of(Settings(gpus=[])).kind == HostGpus()


def test_a_kind_serves_a_need_by_its_name_and_memory() -> None:
    h100, l4, cpu = HostGpus("h100-80gb", 80.0, True), HostGpus("l4-24gb", 24.0, True), HostGpus()
    h100_only = GpuNeed(("h100-80gb",))
    big = GpuNeed(None, 40.0)
    assert serves(h100, h100_only) and not serves(l4, h100_only) and not serves(cpu, h100_only)
    assert serves(h100, big) and not serves(l4, big)
    assert serves(cpu, None) and serves(l4, None)
    assert not serves(HostGpus(None, None, True), big)  # a kind of unknown memory serves no memory asked


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ('gpu_kind = "H100 80GB"', "gpu_kind: String should match pattern"),
        ('gpu_kinds = {"H100" = 80}', "gpu_kinds: Value error, 'H100' is not a GPU kind's name"),
        ('gpu_kinds = {"h100-80gb" = 0}', "gpu_kinds: Value error, h100-80gb: 0.0 GiB"),
    ],
)
def test_settings_refuse_what_is_no_kind(tmp_path: Path, toml: str, says: str) -> None:
    config = tmp_path / "adapterd.toml"
    config.write_text(toml + "\n")
    with pytest.raises(ConfigError, match=says):
        load_settings(config)


def test_the_settings_file_and_the_environment_name_the_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "adapterd.toml"
    config.write_text('gpu_kind = "l4-24gb"\ngpu_kinds = {"l4-24gb" = 24, "h100-80gb" = 80}\n')
    settings = load_settings(config)
    assert settings.gpu_kind == "l4-24gb" and settings.gpu_kinds == {"l4-24gb": 24, "h100-80gb": 80}
    monkeypatch.setenv("ADAPTERD_GPU_KIND", "h100-80gb")
    assert load_settings(config).gpu_kind == "h100-80gb"
