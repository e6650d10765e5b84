"""Progress on a terminal: rollouts in flight, groups queued, update step, success, the
policy server's state and the faults seen (browser disconnects, vLLM outages).

Redrawn once a second from `Daemon.status()` with rich; off a terminal nothing is drawn
(the structlog JSON lines say the same things).
"""

from __future__ import annotations

from typing import Any

import anyio
from rich.console import Console
from rich.live import Live
from rich.table import Table

__all__ = ["show_progress"]


def _fmt(value: Any, pattern: str = "{:.1%}") -> str:
    return "-" if value is None else pattern.format(value)


def render(status: dict[str, Any]) -> Table:
    table = Table(
        title=f"webagent {status.get('mode', '')}: {status.get('model', '')}",
        show_header=False,
        expand=False,
    )
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("stage", str(status.get("stage", "")))
    scheduler = status.get("scheduler") or {}
    learner = status.get("learner") or {}
    table.add_row(
        "rollouts in flight",
        f"{scheduler.get('episodes_in_flight', 0)} episodes, "
        f"{scheduler.get('groups_in_flight', 0)} groups",
    )
    held = scheduler.get("held_for") or []
    if held:
        table.add_row("new turns wait for", ", ".join(held))
    if scheduler.get("waiting_for_learner"):
        table.add_row("new groups wait for", "the learner (they would arrive stale)")
    table.add_row("groups queued", str(scheduler.get("queue_depth", 0)))
    table.add_row("throughput", f"{scheduler.get('steps_per_s', 0.0):.1f} steps/s")
    table.add_row(
        "update",
        f"step {learner.get('step', 0)}, adapter v{status.get('adapter_version', 0)}"
        f"{' (updating)' if learner.get('updating') else ''}",
    )
    # The learner's own counts are live; the event totals under "groups" move only when
    # an update reports them, so before the first update they would show nothing set aside.
    groups = {
        key: learner.get(f"groups_{key}", (status.get("groups") or {}).get(key, 0))
        for key in ("received", "trained", "stale", "zero_variance", "failed")
    }
    table.add_row(
        "groups",
        f"{groups['received']} received: {groups['trained']} trained, "
        f"{groups['zero_variance']} zero-variance, {groups['stale']} stale, "
        f"{groups['failed']} failed",
    )
    table.add_row("success (recent train)", _fmt(status.get("recent_success")))
    evals = status.get("eval_success") or {}
    table.add_row(
        "success (eval)", ", ".join(f"{k} {v:.1%}" for k, v in sorted(evals.items())) or "-"
    )
    server = status.get("server") or {}
    if server:
        state = server.get("state", "up")
        if state == "up":
            recovered = server.get("recovery_s") or []
            last = f", last back after {recovered[-1]:.1f} s" if recovered else ""
            text = f"up ({server.get('outages', 0)} outages{last})"
        else:
            doing = "restarting" if server.get("managed") else "waiting for it; rollouts paused"
            text = f"[bold red]DOWN[/]: {doing} ({server.get('reason', '')})"
        table.add_row("policy server", text)
    faults = status.get("faults") or {}
    table.add_row(
        "faults", ", ".join(f"{kind} {n}" for kind, n in sorted(faults.items())) or "none"
    )
    if status.get("stopping"):
        table.add_row("state", "stopping: draining rollouts, checkpointing")
    return table


async def show_progress(status: Any, console: Console | None = None) -> None:
    """Redraw `status()` every second until cancelled."""
    with Live(
        render(status()), console=console or Console(), refresh_per_second=2, transient=False
    ) as live:
        while True:
            await anyio.sleep(1.0)
            live.update(render(status()))
