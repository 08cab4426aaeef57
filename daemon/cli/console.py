"""Following a request on a terminal: a progress bar (loss, reward, steps done of all, ETA) while it trains and one
readable line per other event; for `adapterd submit --wait` and the demo."""

from __future__ import annotations

from daemon.kafka.event_reader import EventStream
from schemas import TERMINAL_TYPES, Event, Progress, Succeeded


async def follow_to_end(stream: EventStream, request_id: str) -> int:
    """Print the request's events as they come, with a progress bar while it trains; 0 on succeeded."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as ProgressBar

    console = Console(stderr=True)
    with ProgressBar(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console
    ) as bar:
        task = bar.add_task(f"{request_id}: waiting", total=None)
        async for event in stream.events(request_id):
            if isinstance(event, Progress) and event.stage == "evaluate":
                bar.update(
                    task,
                    description=f"{request_id}: evaluating the {event.evaluating}",
                    completed=event.eval_batch,
                    total=event.eval_batches,
                )
                continue
            if isinstance(event, Progress):
                bar.update(task, description=training(request_id, event), completed=event.step, total=event.total_steps)
                continue
            # Not wrapped at the console's width: in output that is not a terminal rich assumes 80
            # columns, and would break a path mid-word.
            bar.console.print(describe(event), soft_wrap=True)
            if event.type in TERMINAL_TYPES:
                return 0 if event.type == "succeeded" else 1
    return 1


def training(request_id: str, event: Progress) -> str:
    """The progress bar's words while a request trains: its loss, and the online methods' reward beside it."""
    loss = f", loss {event.loss:.4f}" if event.loss is not None else ""
    reward = f", reward {event.reward:.4f}" if event.reward is not None else ""
    return f"{request_id}: training{loss}{reward}"


def describe(event: Event) -> str:
    details = {
        "accepted": lambda e: f"method {e.method}",
        "rejected": lambda e: f"{e.reason}: " + "; ".join(f"{x.path or '(message)'}: {x.message}" for x in e.errors),
        "started": lambda e: f"slot {e.slot}, {e.child or f'pid {e.pid}'}",
        "checkpoint": lambda e: f"step {e.step}: {e.path}",
        "succeeded": lambda e: (
            e.location + (f" (commit {e.commit_sha})" if e.commit_sha else "") + (" [duplicate]" if e.duplicate else "")
        ),
        "failed": lambda e: f"{e.code} in {e.stage}: {e.message}",
        "cancelled": lambda e: e.reason,
        "waiting": lambda e: "waits for " + ", ".join(e.after),  # the ids of its `after` not succeeded yet
    }
    detail = details.get(event.type)
    line = f"{event.time:%H:%M:%S} {event.request_id} {event.type} on {event.host}" + (
        f": {detail(event)}" if detail else ""
    )
    if isinstance(event, Succeeded) and event.evaluation is not None:
        # A Hub pull request by its URL; the local sink's (a folder, printed at the end) by its revision.
        hub_pr = event.pr_url if event.sink == "hub" else None
        line += f"\n  gate {event.evaluation.verdict}, published to {event.published}" + (
            f" {hub_pr}" if hub_pr else f" ({event.revision})"
        )
        for rule in event.evaluation.rules:
            value = "n/a" if rule.value is None else f"{rule.value:.4g}"
            numbers = f" ({value} against {rule.bound:.4g})" if rule.bound is not None else ""
            line += f"\n  {rule.outcome}: {rule.rule}{numbers}" + (f": {rule.reason}" if rule.reason else "")
    return line
