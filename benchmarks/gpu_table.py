"""The GPU check's parts that its rows share (benchmarks/gpu_check.py): what a host has, what a row
needs, and the table written after each row."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAILED = ("FAILED", "ERROR", "NOT READY", "CHANGED", "NO", "failed")


@dataclass(frozen=True)
class Host:
    cuda: bool
    vllm: bool
    bitsandbytes: bool
    gpu: str = ""
    gpus: int = 0  # CUDA devices this host has
    versions: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    needs_cuda: bool = False
    needs: str = ""  # a module the rows need in the children, besides torch
    min_gpus: int = 1  # GPUs the row needs on the host
    target: str = ""


class Table:
    """The check's rows, written out after each one (a run stopped at its limit keeps what it had)."""

    def __init__(self, out: Path, budget_s: float, host: Host) -> None:
        self.out, self.budget_s, self.host, self.started = out, budget_s, host, time.monotonic()
        self.rows: list[dict[str, Any]] = []
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def say(self, *words: object) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s]", *words, flush=True)

    def row(self, measure: str, value: object, note: str = "", target: str = "") -> None:
        self.rows.append({"measure": measure, "value": value, "target": target, "note": note})
        self.say("ROW", measure, "=", value, note)
        self.write()

    def header(self) -> str:
        versions = dict(self.host.versions)
        return (
            f"adapterd GPU check, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
            f"{self.host.gpu or 'no GPU (CPU mode)'}; torch {versions.get('torch')}, trl {versions.get('trl')}, "
            f"transformers {versions.get('transformers')}, {len(os.sched_getaffinity(0))} cores"
        )

    def markdown(self) -> str:
        lines = [self.header(), "", "| measure | value | target | note |", "|---|---|---|---|"]
        lines += [
            f"| {r['measure']} | {r['value']} | {r['target']} | {str(r['note']).replace('|', '/')} |" for r in self.rows
        ]
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        (self.out / "gpu_check.json").write_text(
            json.dumps({"host": self.host.__dict__, "rows": self.rows}, indent=1, default=str)
        )
        (self.out / "gpu_check.md").write_text(self.markdown())

    def failed(self) -> bool:
        return any(str(row["value"]) in FAILED for row in self.rows)
