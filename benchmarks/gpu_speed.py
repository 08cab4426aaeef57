"""The GPU check's rows that measure what packing and the speed settings buy (issue 39;
benchmarks/gpu_check.py says which run where): jobs at once through the daemon's own packing
(`max_jobs_per_gpu`), the host's speed settings against TRL's defaults, a 7B-shaped job's share of
the GPU's peak, and the plain-TRL figures they stand on."""

from __future__ import annotations

import traceback

from benchmarks.gpu_daemon import Daemon, plain
from benchmarks.gpu_jobs import sft_request, tokens_per_row
from benchmarks.gpu_rows import GIB, Run, brief, gib
from benchmarks.gpu_table import Check


async def packing(run: Run, daemon: Daemon, check: Check) -> None:
    """Jobs at once through the daemon's own packing: one daemon whose GPU takes up to the most asked
    (`max_jobs_per_gpu`), a partition a job. Without CUDA, one declared GPU ("-1", which hides every
    GPU from the children) of 8 GiB, so the slots pack tiny CPU jobs by their estimates all the same."""
    counts = [int(n) for n in run.args.packing.split(",") if n] if run.cuda else [1, 2]
    host = {} if run.cuda else {"gpus": ["-1"], "gpu_memory_bytes": 8 * GIB}
    packer = Daemon(
        run.args.root / "work-packing",
        [run.args.root],
        run.cuda,
        partitions=max(counts),
        max_jobs_per_gpu=max(counts),
        **host,
    )
    await packer.start()
    alone = None
    try:
        for count in counts:
            if run.table.left() < 60:
                run.table.row(f"{count} LoRA job(s) at once through max_jobs_per_gpu", "not run (budget)")
                continue
            result = await packer.at_once(
                [run.sft(f"pack{count}-{i}") for i in range(count)], timeout_s=min(600, run.table.left())
            )
            finals = [job["final"] for job in result["jobs"]]
            failed = [final for final in finals if final["type"] != "succeeded"]
            if failed:
                run.table.row(
                    f"{count} LoRA job(s) at once through max_jobs_per_gpu", "FAILED", brief(failed[0]), check.target
                )
                break
            aggregate = sum(run.samples(final) for final in finals) * run.tokens
            alone = alone or aggregate
            memories = [final.get("memory") for final in finals]
            run.table.row(
                f"{count} LoRA job(s) at once through max_jobs_per_gpu: aggregate tokens/s",
                round(aggregate),
                f"{aggregate / alone:.2f}x one alone; most jobs on one GPU at once (the daemon's slots): "
                f"{result['most_on_a_gpu']}; wall {result['wall']:.1f} s; child peaks "
                f"{[gib(m, 'peak_allocated_bytes') for m in memories]} GiB, estimate "
                f"{gib(memories[0], 'estimate_bytes')} GiB; GPU peak {result['peak']:.0f} MiB",
                check.target if count == 8 else "",
            )
    finally:
        await packer.stop()


async def fast(run: Run, daemon: Daemon, check: Check) -> None:
    off = await daemon.job(run.sft("fast-off"), timeout_s=min(400, run.table.left()))
    quick = Daemon(
        run.args.root / "work-fast",
        [run.args.root],
        run.cuda,
        gradient_checkpointing_when_needed=True,
        fastest_attention=True,
        liger_kernel=True,
    )
    await quick.start()
    try:
        on = await quick.job(run.sft("fast-on"), timeout_s=min(400, run.table.left()))
    finally:
        await quick.stop()
    if off["final"]["type"] != "succeeded" or on["final"]["type"] != "succeeded":
        run.table.row(
            "speed settings on against TRL's defaults",
            "FAILED",
            f"off: {brief(off['final'])}; on: {brief(on['final'])}",
            check.target,
        )
        return
    a, b = on["final"]["metrics"], off["final"]["metrics"]
    loss = abs(a["train_loss"] - b["train_loss"]) / abs(b["train_loss"])
    run.table.row(
        "speed settings on: tokens/s over TRL's defaults",
        round(a["train_samples_per_second"] / b["train_samples_per_second"], 3),
        f"{a['train_samples_per_second'] * run.tokens:.0f} vs {b['train_samples_per_second'] * run.tokens:.0f} "
        f"tokens/s; train_loss differs by {loss:.2e} (relative); child peaks "
        f"{gib(on['final'].get('memory'), 'peak_allocated_bytes')} vs "
        f"{gib(off['final'].get('memory'), 'peak_allocated_bytes')} GiB",
        check.target,
    )


async def lora_7b(run: Run, daemon: Daemon, check: Check) -> None:
    from benchmarks.gpu_jobs import QWEN2_7B, lora_flops_per_token, measured_bf16_tflops

    if run.table.left() < 240:
        run.table.row("7B-shaped LoRA job", "not run (budget)", target=check.target)
        return
    model = run.build("qwen7b", "--shape", "7b")
    peak = measured_bf16_tflops()
    result = await daemon.job(
        sft_request(model, f"lora-7b-{run.run_id}", run.steps, run.rows), timeout_s=min(600, run.table.left())
    )
    final = result["final"]
    if final["type"] != "succeeded":
        run.table.row("7B-shaped LoRA job", "FAILED", brief(final), check.target)
        return
    rate = run.samples(final) * tokens_per_row(model, run.rows)
    achieved = rate * lora_flops_per_token(QWEN2_7B, checkpointing=True) / 1e12
    run.table.row(
        "7B-shaped LoRA job: share of the measured bf16 peak",
        f"{100 * achieved / peak:.1f}%",
        f"{rate:.0f} tokens/s x 6N (checkpointing on, TRL's default) = {achieved:.0f} TFLOP/s of {peak:.0f} measured; "
        f"child peak {gib(final.get('memory'), 'peak_allocated_bytes')} GiB, estimate "
        f"{gib(final.get('memory'), 'estimate_bytes')} GiB",
        check.target,
    )


async def plain_at_once(run: Run, daemon: Daemon, check: Check) -> None:
    for copies in [int(n) for n in run.args.concurrent.split(",") if n]:
        if run.table.left() < 90:
            run.table.row(f"{copies} plain SFT jobs at once on one GPU", "not run (budget)")
            continue
        try:
            runs = plain(run.args.root, run.sft(f"together-{copies}"), copies)
            total = sum(r["train_samples_per_second"] for r in runs) * run.tokens
            run.table.row(
                f"{copies} plain SFT jobs at once on one GPU: aggregate tokens/s",
                round(total, 1),
                f"each {[round(r['train_samples_per_second'] * run.tokens) for r in runs]}",
                check.target,
            )
        except Exception:
            run.table.row(f"{copies} plain SFT jobs at once", "ERROR", traceback.format_exc()[-800:])


async def checkpointing(run: Run, daemon: Daemon, check: Check) -> None:
    request = run.sft("no-checkpointing")
    request["training"]["gradient_checkpointing"] = False  # TRL turns it on by default
    try:
        [result] = plain(run.args.root, request)
    except Exception:
        run.table.row("plain SFT, gradient checkpointing off", "ERROR", traceback.format_exc()[-800:])
        return
    run.table.row(
        "plain SFT tokens/s, gradient checkpointing off (TRL's default: on)",
        round(result["train_samples_per_second"] * run.tokens, 1),
        f"median step {result['median_step_s'] * 1000:.1f} ms; compare the plain rows above",
        check.target,
    )
