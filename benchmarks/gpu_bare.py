"""`python -m benchmarks.gpu_bare`: the GPU check for a bare GPU machine (issue 38), one run, one table.

A machine lent for GPU checks has Python and its own torch, and no JVM, no network, no uv: so this
check runs adapterd's real `Service` (scheduler, supervisor, fork server, children, local sink) on
Kafka in memory (testbed/memory_kafka.py) and the local sink instead of the Hub, beside plain TRL
(benchmarks/plain_sft.py) in the same process tree. benchmarks/gpu_wheels.py builds the wheels that
machine lacks and benchmarks/gpu_bare.sh installs them and runs this. Rows:

- SFT LoRA on a model of Qwen2.5-0.5B's shape (random weights, bf16, built here): plain TRL and the
  daemon in ABBA order, tokens/s and median step of each run, and their ratios with spread;
- warm start: the fork server alive and the same before and after the jobs, CUDA untouched in it
  (no /dev/nvidia* open, no context), each job's child forked from it, arrival to first step;
- GPU memory (nvidia-smi) before each daemon job, its peak and after it;
- the stages of a job (`durations_s`, with load_model's and train's parts);
- QLoRA 4-bit through the daemon;
- one job of every method this TRL ships, on the tiny model (on the GPU when there is one);
- with budget left, N plain SFT jobs at once on one GPU against one alone (aggregate tokens/s), and
  one with gradient checkpointing off against TRL's default (on): figures for packing jobs on a GPU.

Without CUDA (or with `--cpu`) the same rows run on the tiny model for a few steps, GPU rows marked
skipped: so the check's own path is known to work on any machine. It stops starting rows when its
budget (`--budget-s`) runs low. The table goes to stdout and, as JSON and Markdown, to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.gpu_jobs import cuda_state, gpu_compute_pids, long_rows, sft_request, tokens_per_row, untouched

TERMINAL = ("succeeded", "failed", "rejected", "cancelled")


class Table:
    """The check's rows, written out after each one (a run stopped at its limit keeps what it had)."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out, self.budget_s, self.started = out, budget_s, time.monotonic()
        self.rows: list[dict[str, Any]] = []
        self.host: dict[str, Any] = {}
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def say(self, *words: object) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s]", *words, flush=True)

    def row(self, measure: str, value: object, note: str = "") -> None:
        self.rows.append({"measure": measure, "value": value, "note": note})
        self.say("ROW", measure, "=", value, note)
        self.write()

    def write(self) -> None:
        (self.out / "gpu_bare.json").write_text(json.dumps({"host": self.host, "rows": self.rows}, indent=1, default=str))
        lines = [f"GPU check (bare machine), {time.strftime('%Y-%m-%d')}, {self.host.get('gpu') or 'no GPU'}; "
                 f"torch {self.host.get('versions', {}).get('torch')}, trl {self.host.get('versions', {}).get('trl')}", "",
                 "| measure | value | note |", "|---|---|---|"]
        lines += [f"| {r['measure']} | {r['value']} | {str(r['note']).replace('|', '/')} |" for r in self.rows]
        (self.out / "gpu_bare.md").write_text("\n".join(lines) + "\n")


def host() -> dict[str, Any]:
    """What this machine has, asked of another interpreter: this one never touches CUDA, so the GPU
    memory it reads is the daemon's and its children's only."""
    script = (
        "import json, torch, importlib.metadata as m; c = torch.cuda.is_available(); v = {}\n"
        "for p in ['torch','transformers','trl','peft','datasets','accelerate','bitsandbytes','pydantic','aiokafka']:\n"
        "  try: v[p] = m.version(p)\n  except Exception: v[p] = 'missing'\n"
        "print(json.dumps({'cuda': c, 'gpu': torch.cuda.get_device_name(0) if c else '', 'python': '%d.%d' % __import__('sys').version_info[:2], 'versions': v}))"
    )
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def gpu_used_mib() -> float:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    return sum(float(x) for x in out.split())


class PeakMemory:
    """The GPU's used memory sampled every 0.2 s while a job runs (nothing without CUDA)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.peak, self._stop = cuda, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, gpu_used_mib())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.cuda:
            self._thread.join()


def plain(root: Path, request: dict[str, Any], copies: int = 1) -> list[dict[str, Any]]:
    """The same SFT job as plain TRL scripts (benchmarks.plain_sft), `copies` of them at once."""
    path = root / f"plain-{request['request_id']}.json"
    path.write_text(json.dumps(request))
    started = time.monotonic()
    runs = [subprocess.Popen([sys.executable, "-m", "benchmarks.plain_sft", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(copies)]
    results = []
    for run in runs:
        out, err = run.communicate()
        if run.returncode != 0:
            raise RuntimeError("plain TRL failed: " + err[-2000:])
        results.append({"wall": time.monotonic() - started, **json.loads(out.strip().splitlines()[-1])})
    return results


class Daemon:
    """adapterd's `Service` on Kafka in memory; its children, fork server, scheduler, supervisor,
    publisher and local sink are the real ones."""

    def __init__(self, root: Path, cuda: bool) -> None:
        from aiokafka import TopicPartition

        from daemon.service import Service
        from daemon.settings import Settings
        from testbed.memory_kafka import FakeConsumer, FakeProducer

        self.settings = Settings(work_dir=root / "work", allowed_local_model_roots=[root], metrics_address=None,
                                 log_format="json", progress_interval_s=5, stall_timeout_s=600, hub_token=None)

        class PolledConsumer(FakeConsumer):
            async def getmany(self, *partitions: TopicPartition, timeout_ms: int, max_records: int) -> Any:
                batches = await super().getmany(*partitions, timeout_ms=timeout_ms, max_records=max_records)
                if not batches:  # a real poll waits when nothing is there; one that returns at once never yields the loop
                    await asyncio.sleep(min(timeout_ms, 200) / 1000)
                return batches

        self.consumer, self.producer = PolledConsumer(), FakeProducer()
        self.service = Service(self.settings, consumer=self.consumer, producer=self.producer)
        self.service.control = NoControl()  # type: ignore[assignment]  # the control topic needs a broker: cancels are not checked here
        self.tp = TopicPartition(self.settings.requests_topic, 0)
        self.consumer.committed[self.tp] = 0
        self.consumer.records[self.tp] = []
        self.offset = 0
        self.cuda = cuda
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self.service.run())
        for _ in range(1200):
            if self.forkserver_pid() is not None and "ready; one thread" in self.children_log():
                return
            await asyncio.sleep(0.25)

    def children_log(self) -> str:
        path = self.settings.work_dir / "children.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def forkserver_pid(self) -> int | None:
        import psutil

        for process in psutil.Process().children(recursive=True):
            try:
                if "handlers.child.forkserver" in " ".join(process.cmdline()):
                    return process.pid
            except psutil.Error:
                continue
        return None

    def events(self, request_id: str) -> list[dict[str, Any]]:
        found = [json.loads(m.value) for m in self.producer.on(self.settings.events_topic)]
        return [e for e in found if e.get("request_id") == request_id]

    async def job(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        from testbed.memory_kafka import FakeRecord

        rid = request["request_id"]
        before = gpu_used_mib() if self.cuda else 0.0
        started = time.monotonic()
        self.consumer.records[self.tp].append(FakeRecord(self.tp.topic, 0, self.offset, rid.encode(), json.dumps(request).encode(), [], int(time.time() * 1000)))
        self.offset += 1
        assert self.task is not None
        parent, native = None, set()  # the job's child seen from outside: who forked it, which bitsandbytes library it mapped
        with PeakMemory(self.cuda) as memory:
            while time.monotonic() - started < timeout_s and not any(e["type"] in TERMINAL for e in self.events(rid)):
                if self.task.done():
                    raise RuntimeError(f"the service ended: {self.task.exception()!r}")
                pid = next((e["pid"] for e in self.events(rid) if e["type"] == "started"), None)
                if pid is not None:
                    try:
                        parent = parent or int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                        native |= {line.rsplit("/", 1)[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if "libbitsandbytes_" in line}
                    except (OSError, IndexError, ValueError):
                        pass  # it ended
                await asyncio.sleep(0.2)
        wall = time.monotonic() - started
        await asyncio.sleep(1.0)  # the child's exit, its memory handed back
        after = gpu_used_mib() if self.cuda else 0.0
        events = self.events(rid)
        return {"final": events[-1] if events else {"type": "timeout"}, "wall": wall, "before": before, "peak": memory.peak, "after": after,
                "forked": parent is not None and parent == self.forkserver_pid(), "native": sorted(native)}

    async def stop(self) -> None:
        self.service.request_stop()
        if self.task is not None:
            await asyncio.wait_for(self.task, 120)


class NoControl:
    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


def brief(final: dict[str, Any]) -> str:
    if final.get("type") == "succeeded":
        return f"samples/s {final['metrics'].get('train_samples_per_second')}, median step {final['metrics'].get('median_step_s')} s"
    return json.dumps({k: final.get(k) for k in ("type", "code", "message", "errors", "stage")}, default=str)[:500]


def spread(values: list[float]) -> str:
    return f"min {min(values):.3f}, max {max(values):.3f}, n {len(values)}" if values else "no runs"


async def check(args: argparse.Namespace) -> Table:
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the children, and the daemon's slots, see no GPU
    table = Table(args.out, args.budget_s)
    table.host = host()
    cuda = table.host["cuda"] and not args.cpu
    table.say("host", table.host)
    root = args.root
    root.mkdir(parents=True, exist_ok=True)
    tiny = root / "tiny"
    subprocess.run([sys.executable, "-m", "handlers.fixtures.tiny_model", str(tiny)], check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "handlers.fixtures.tiny_model", str(root / "tiny-teacher"), "1"], check=True, capture_output=True)
    if cuda:
        model = root / "qwen05b"
        # The tokenizer is the tiny one, not padded to the model's 151,936 ids: the model computes every
        # logit all the same, and tokenizing stays fast (a padded one made load_model's figure meaningless).
        subprocess.run([sys.executable, "-c", f"from pathlib import Path; from benchmarks.gpu_jobs import build_qwen2_05b; "
                        f"build_qwen2_05b(Path({str(model)!r}), pad_tokenizer=False)"], check=True)
        rows, steps = long_rows(), args.steps
    else:
        from testbed.data import CHAT_ROWS

        model, rows, steps = tiny, CHAT_ROWS * 8, min(args.steps, 6)
    tokens = tokens_per_row(model, rows)
    table.say("models built; tokens a row", round(tokens, 1))

    run_id = time.strftime("%H%M%S")  # a request id that succeeded in this work folder before is not trained again

    def sft(rid: str, **kw: Any) -> dict[str, Any]:
        request = sft_request(model, f"{rid}-{run_id}", steps, rows, **kw)
        if not cuda:
            request["training"]["bf16"] = False
            request["model"]["dtype"] = "float32"
            request["training"]["per_device_train_batch_size"] = 4
        return request

    daemon = Daemon(root, cuda)
    await daemon.start()
    server = daemon.forkserver_pid()
    first_state = cuda_state(server) if server else {}
    ready_line = next((line for line in daemon.children_log().splitlines() if "fork server" in line and ("ready" in line or "refused" in line)), "no line")
    table.row("fork server before any job", "ready" if "ready; one thread" in ready_line else "NOT READY",
              f"pid {server}; {json.dumps(first_state)}; {ready_line.split(': ', 1)[-1][:200]}")

    plain_runs: list[dict[str, Any]] = []
    daemon_runs: list[dict[str, Any]] = []
    for index, side in enumerate(args.order.split(",")):
        if table.left() < args.reserve_s:
            table.say("budget: no more pairs")
            break
        try:
            if side == "P":
                [run] = plain(root, sft(f"plain-{index}"))
                plain_runs.append(run)
                table.say("plain", {k: run.get(k) for k in ("wall", "train_samples_per_second", "median_step_s")})
            else:
                run = await daemon.job(sft(f"daemon-{index}"), timeout_s=min(400, table.left()))
                daemon_runs.append(run)
                table.say("daemon", brief(run["final"]), "memory", run["before"], run["peak"], run["after"])
        except Exception:
            table.row(f"SFT run {index} ({side})", "FAILED", traceback.format_exc()[-1200:])
    done = [run for run in daemon_runs if run["final"]["type"] == "succeeded"]
    if plain_runs:
        p_tput = [run["train_samples_per_second"] * tokens for run in plain_runs]
        p_step = [run["median_step_s"] for run in plain_runs]
        table.row("SFT LoRA tokens/s: plain TRL", round(statistics.median(p_tput), 1), f"runs {[round(t) for t in p_tput]}; {model.name}, {steps} steps")
        table.row("plain TRL process wall (s)", [round(run["wall"], 1) for run in plain_runs], "imports, model, training: a cold start")
    if done:
        d_tput = [run["final"]["metrics"]["train_samples_per_second"] * tokens for run in done]
        d_step = [run["final"]["metrics"]["median_step_s"] for run in done]
        table.row("SFT LoRA tokens/s: daemon", round(statistics.median(d_tput), 1), f"runs {[round(t) for t in d_tput]}")
        if plain_runs:
            ratios = [d / p for d in d_tput for p in p_tput]
            table.row("tokens/s ratio daemon/plain", round(statistics.median(ratios), 3), f"every daemon run over every plain run: {spread(ratios)}")
            table.row("median step plain / daemon (ms)", f"{statistics.median(p_step) * 1000:.1f} / {statistics.median(d_step) * 1000:.1f}",
                      f"plain {[round(s * 1000, 1) for s in p_step]}, daemon {[round(s * 1000, 1) for s in d_step]}")
        table.row("arrival to first step, daemon (s)", [round(run["final"]["durations_s"].get("until_first_step", -1), 1) for run in done],
                  f"children forked from the server: {sum(run['forked'] for run in done)} of {len(done)}")
        last = done[-1]["final"]["durations_s"]
        table.row("stages of a daemon SFT job (s)", json.dumps({k: v for k, v in last.items() if k not in ("queue",)}))
        if cuda:
            table.row("GPU MiB before / peak / after (daemon SFT jobs)", [[round(r["before"]), round(r["peak"]), round(r["after"])] for r in done])
    if len(done) < len(daemon_runs):
        table.row("daemon SFT", "FAILED", brief(next(run for run in daemon_runs if run["final"]["type"] != "succeeded")["final"]))

    jobs: list[tuple[str, dict[str, Any]]] = []
    if cuda:
        jobs.append(("QLoRA 4-bit SFT (0.5B)", sft("qlora-0", quantization="4bit")))
    from importlib.metadata import version

    from daemon.cli.demo_requests import demo_request
    from schemas.methods import METHODS, unsupported_reason

    shipped = [name for name in METHODS if unsupported_reason(name, version("trl")) is None]
    for name in [m for m in shipped if m in args.methods.split(",")] if args.methods else shipped:
        request = json.loads(demo_request(name, tiny).model_dump_json(exclude_none=True))
        request["request_id"] = f"method-{name}-{run_id}"
        if cuda:
            request.setdefault("training", {})["bf16"] = True
            request["model"]["dtype"] = "bfloat16"
        jobs.append((f"{name} (demo request, tiny model{', bf16 on the GPU' if cuda else ', CPU'})", request))
    for title, request in jobs:
        if table.left() < 30:
            table.row(title, "not run (budget)")
            continue
        try:
            run = await daemon.job(request, timeout_s=min(240, table.left() - 15))
            note = f"{run['wall']:.1f} s; {'forked' if run['forked'] else 'NOT forked'}; {brief(run['final'])}"
            if run["native"]:
                note += f"; bitsandbytes library in the child: {', '.join(run['native'])}"
            if cuda:
                note += f"; GPU MiB before {run['before']:.0f}, peak {run['peak']:.0f}, after {run['after']:.0f}"
            table.row(title, run["final"]["type"], note)
        except Exception:
            table.row(title, "ERROR", traceback.format_exc()[-1200:])

    after = daemon.forkserver_pid()
    state = cuda_state(after) if after else {}
    table.row("fork server after the jobs", "same server, CUDA untouched" if after == server and state and untouched(state) else "CHANGED",
              f"pid {server} -> {after}; {json.dumps(state)}; compute pids {sorted(gpu_compute_pids())}")
    await daemon.stop()
    if cuda:
        table.row("GPU MiB after the daemon stopped", gpu_used_mib())
        for copies in [int(n) for n in args.concurrent.split(",") if n]:
            if table.left() < 90:
                table.row(f"{copies} plain SFT jobs at once on one GPU", "not run (budget)")
                continue
            try:
                runs = plain(root, sft(f"together-{copies}"), copies)
                total = sum(run["train_samples_per_second"] for run in runs) * tokens
                table.row(f"{copies} plain SFT jobs at once on one GPU: aggregate tokens/s", round(total, 1),
                          f"each {[round(run['train_samples_per_second'] * tokens) for run in runs]}")
            except Exception:
                table.row(f"{copies} plain SFT jobs at once", "ERROR", traceback.format_exc()[-800:])
        if table.left() >= 60:
            try:
                request = sft("no-checkpointing")
                request["training"]["gradient_checkpointing"] = False  # TRL turns it on by default
                [run] = plain(root, request)
                table.row("plain SFT tokens/s, gradient checkpointing off (TRL's default: on)", round(run["train_samples_per_second"] * tokens, 1),
                          f"median step {run['median_step_s'] * 1000:.1f} ms; compare the plain rows above")
            except Exception:
                table.row("plain SFT, gradient checkpointing off", "ERROR", traceback.format_exc()[-800:])
    table.row("check wall (s)", round(time.monotonic() - table.started, 1))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cpu", action="store_true", help="CPU mode on a GPU host")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps of each SFT run on the GPU")
    parser.add_argument("--order", default="P,D,D,P", help="plain (P) and daemon (D) SFT runs, in order")
    parser.add_argument("--methods", default="", help="comma-separated methods to run one job of (default: every one)")
    parser.add_argument("--concurrent", default="2,4", help="how many plain jobs to run at once on one GPU, each a row")
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no row that would run past this")
    parser.add_argument("--reserve-s", type=float, default=200.0, help="budget kept for the rows after the SFT pairs")
    parser.add_argument("--root", type=Path, default=Path("/tmp/adapterd-gpu-bare"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    args = parser.parse_args(argv)
    table = asyncio.run(check(args))
    print("\n" + (args.out / "gpu_bare.md").read_text())
    return 1 if any(r["value"] in ("FAILED", "ERROR", "NOT READY", "CHANGED") or r["value"] == "failed" for r in table.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
