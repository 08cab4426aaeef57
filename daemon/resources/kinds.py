"""What kind of GPU a host has, and whether a kind serves what a request asks (`resources.gpu_kind`,
`resources.min_gpu_memory_gib`).

A kind is a short name: the model as the driver names it, less the vendor and the form factor, and its nominal
memory (`h100-80gb`, `a100-40gb`, `l4-24gb`), made from nvidia-smi's `name` and `memory.total` (`kind_of`). The
memory is always in the name, so that an A100 of 40 GB and one of 80 GB are two kinds, and a kind says its size
wherever it is read (an event, a request). The operator may name the host's kind (`gpu_kind`) and declare the
fleet's kinds with their memory (`gpu_kinds`): a declared kind's memory is the declared figure, else the name's.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence

import structlog

from daemon.admission.gpu_kinds import HostGpus, kind_memory
from daemon.resources.nvidia_smi import query_gpus
from daemon.settings import Settings
from schemas.common import GPU_KIND_PATTERN

log = structlog.get_logger()

# The vendor's words and the form factors, which do not make another kind.
_NOISE = {"nvidia", "tesla", "geforce", "quadro", "pcie", "sxm", "sxm2", "sxm4", "sxm5", "hbm2", "hbm2e", "hbm3"}
_NOISE_PATTERN = re.compile(r"^(?:\d+gb|hbm\d+e?|sxm\d*|pcie)$")
# The memory sizes GPUs are sold with, in GB: what nvidia-smi's total (less what the driver keeps) is rounded up to when
# the name does not say it (an L4's 23,034 MiB is a 24 GB card; an H200's 143,771 MiB a 141 GB one).
NOMINAL_GB = (4, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 141, 180, 192, 288)
_SIZE_IN_NAME = re.compile(r"(\d+)\s*gb\b")


def nominal_gb(name: str, memory_mib: float) -> int:
    """The card's memory as it is sold: said in its name ('A100-SXM4-40GB'), else the smallest size it reaches."""
    said = _SIZE_IN_NAME.search(name.lower())
    if said:
        return int(said.group(1))
    gib = memory_mib / 1024
    return next((size for size in NOMINAL_GB if size >= gib * 0.98), math.ceil(gib))


def kind_of(name: str, memory_mib: float) -> str:
    """The kind of a GPU nvidia-smi calls `name` with `memory_mib` of memory: its model's words up to the first with a
    digit, less the vendor's and the form factor's, joined by '-', then its nominal memory ('NVIDIA H100 80GB HBM3',
    81,559 MiB: 'h100-80gb'; 'NVIDIA GeForce RTX 4090': 'rtx-4090-24gb'); a name of none: 'gpu-NNgb'."""
    words = [w for w in re.split(r"[\s_/-]+", name.lower()) if w and w not in _NOISE and not _NOISE_PATTERN.match(w)]
    model: list[str] = []
    for word in words:
        model.append(re.sub(r"[^a-z0-9.]", "", word))
        if any(c.isdigit() for c in word):
            break
    stem = "-".join(w for w in model if w) or "gpu"
    kind = f"{stem}-{nominal_gb(name, memory_mib)}gb"
    return kind[:32] if re.fullmatch(GPU_KIND_PATTERN, kind[:32]) else f"gpu-{nominal_gb(name, memory_mib)}gb"


def parse_gpus(listed: Iterable[str]) -> list[tuple[str, str, float]]:
    """nvidia-smi's `--query-gpu=index,name,memory.total --format=csv,noheader,nounits` lines as (index, name, MiB);
    a line it cannot read is left out (logged)."""
    found = []
    for line in listed:
        index, _, rest = line.partition(",")
        name, _, memory = rest.rpartition(",")
        try:
            found.append((index.strip(), name.strip(), float(memory)))
        except ValueError:
            log.warning("gpus.kind_unread", line=line[:200])
    return found


def detect(gpus: Sequence[str], listed: Iterable[str] | None) -> tuple[str, float] | None:
    """The kind and nominal memory (GiB) of the host's `gpus` from nvidia-smi's lines (`parse_gpus`), or None. GPUs of
    several kinds on one host: the one of least memory, for a job may be given any of them (logged)."""
    found = parse_gpus(listed or [])
    mine = [gpu for gpu in found if gpu[0] in gpus] or found  # ids that are not indices (UUIDs): every GPU
    if not mine:
        return None
    kinds = {kind_of(name, mib): float(nominal_gb(name, mib)) for _, name, mib in mine}
    if len(kinds) > 1:
        log.warning("gpus.kinds_mixed", kinds=sorted(kinds), taken=min(kinds, key=lambda k: kinds[k]))
    kind = min(kinds, key=lambda k: kinds[k])
    return kind, kinds[kind]


def host_gpus(settings: Settings, gpus: Sequence[str], environ: Mapping[str, str] = os.environ) -> HostGpus:
    """This host's GPUs (`gpus`, discovered): the kind `gpu_kind` names, else nvidia-smi's; their memory as `gpu_kinds`
    declares the kind's, else as detected, else `gpu_memory_bytes`. A host without GPUs has no kind."""
    if not gpus:
        return HostGpus()
    detected = None if settings.gpu_kind is not None else detect(gpus, query_gpus("index,name,memory.total", environ))
    kind = settings.gpu_kind or (detected[0] if detected else None)
    memory = kind_memory(kind, settings.gpu_kinds) if kind is not None else None
    if memory is None and settings.gpu_memory_bytes is not None:
        memory = round(settings.gpu_memory_bytes / 2**30, 1)
    return HostGpus(kind, memory, True)
