"""Metrics derived from events: a JSON-lines log, Prometheus text, and the learning curve.

Every `Event` the daemon sees goes through `MetricsBook.record`: it is appended to
`metrics.jsonl` in the run directory and folded into counters and gauges. The learning
curve PNG is redrawn from that file, so it can also be drawn after the fact; while a run
lasts, `CurvePlotter` redraws it after updates and evaluations, at most every 10 s.
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import anyio
import structlog

from runtime.base.messages import (
    AdapterPublished,
    AdapterSwapped,
    EpisodeFinished,
    EpisodeStarted,
    EvalFinished,
    Event,
    Fault,
    GroupReady,
    TurnTaken,
    UpdateApplied,
    decode_event,
    encode,
)
from runtime.scheduler import SchedulerStatistics
from runtime.supervisor import ServerState

__all__ = ["CurvePlotter", "MetricsBook", "plot_learning_curve", "read_events"]

log = structlog.get_logger("runtime.metrics")


class MetricsBook:
    """Counters and gauges folded from events, optionally logged to a JSON-lines file."""

    def __init__(self, path: Path | None = None, *, window: int = 200) -> None:
        self._file: IO[bytes] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("ab")
        self.episodes: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        self.recent_rewards: deque[float] = deque(maxlen=window)
        self.recent_tokens: deque[float] = deque(maxlen=window)
        self.adapter_version = 0
        self.last_swap_s: float | None = None
        self.eval_success: dict[str, float] = {}
        self.last_update: dict[str, float] = {}

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def record(self, event: Event) -> None:
        if self._file is not None:
            self._file.write(encode(event) + b"\n")
            self._file.flush()
        match event:
            case EpisodeStarted():
                self.counts["episodes_started"] += 1
            case TurnTaken():
                self.counts["turns"] += 1
            case EpisodeFinished(status=status, reward=reward, turns=turns):
                self.episodes[status] += 1
                if not event.split or event.split == "train":
                    self.recent_rewards.append(reward)
                if turns:
                    self.recent_tokens.append(event.prompt_tokens / turns)
            case GroupReady():
                self.counts["groups"] += 1
            case UpdateApplied(version=version):
                self.counts["updates"] += 1
                self.counts["groups_trained"] += event.groups_trained
                self.counts["groups_stale"] += event.groups_stale
                self.counts["groups_zero_variance"] += event.groups_zero_variance
                self.counts["groups_failed"] += event.groups_failed
                self.counts["trajectories_dropped"] += event.trajectories_dropped
                self.last_update = dict(event.metrics)
                self.adapter_version = max(self.adapter_version, version)
            case AdapterPublished(version=version):
                self.counts["adapters_published"] += 1
                self.adapter_version = max(self.adapter_version, version)
            case AdapterSwapped(latency_s=latency):
                self.counts["adapter_swaps"] += 1
                self.last_swap_s = latency
            case EvalFinished(split=split, success=success):
                self.eval_success[split] = success
            case Fault(kind=kind):
                self.faults[kind] += 1

    def summary(self) -> dict[str, Any]:
        """The figures `/status` shows."""
        rewards = list(self.recent_rewards)
        return {
            "adapter_version": self.adapter_version,
            "updates": self.counts["updates"],
            "episodes": dict(self.episodes),
            "recent_success": statistics.fmean(rewards) if rewards else None,
            "recent_episodes": len(rewards),
            "eval_success": dict(self.eval_success),
            "groups": {
                "received": self.counts["groups"],
                "trained": self.counts["groups_trained"],
                "stale": self.counts["groups_stale"],
                "zero_variance": self.counts["groups_zero_variance"],
                "failed": self.counts["groups_failed"],
                "trajectories_dropped": self.counts["trajectories_dropped"],
            },
            "last_swap_s": self.last_swap_s,
            "last_update": self.last_update,
            "faults": dict(self.faults),
        }

    def prometheus(
        self,
        *,
        server: ServerState | None = None,
        scheduler: SchedulerStatistics | None = None,
    ) -> str:
        """Prometheus text exposition format (version 0.0.4): the counters of the events
        recorded, and the gauges of the policy server's supervisor and the scheduler when
        given."""
        out: list[str] = []

        def metric(name: str, kind: str, samples: Iterable[tuple[str, float]]) -> None:
            out.append(f"# TYPE webagent_{name} {kind}")
            out.extend(f"webagent_{name}{labels} {value:g}" for labels, value in samples)

        metric(
            "episodes_total",
            "counter",
            ((f'{{status="{s}"}}', n) for s, n in sorted(self.episodes.items())),
        )
        for name in (
            "turns",
            "groups",
            "updates",
            "groups_trained",
            "groups_stale",
            "groups_zero_variance",
            "groups_failed",
            "trajectories_dropped",
            "adapter_swaps",
        ):
            metric(f"{name}_total", "counter", [("", self.counts[name])])
        metric(
            "faults_total",
            "counter",
            ((f'{{kind="{k}"}}', n) for k, n in sorted(self.faults.items())),
        )
        metric("adapter_version", "gauge", [("", self.adapter_version)])
        if self.recent_rewards:
            metric("recent_success", "gauge", [("", statistics.fmean(self.recent_rewards))])
        if self.last_swap_s is not None:
            metric("last_swap_seconds", "gauge", [("", self.last_swap_s)])
        metric(
            "eval_success",
            "gauge",
            ((f'{{split="{s}"}}', v) for s, v in sorted(self.eval_success.items())),
        )
        if server is not None:
            metric("policy_server_up", "gauge", [("", int(server.state == "up"))])
            metric("policy_server_restarts_total", "counter", [("", server.restarts)])
        if scheduler is not None:
            metric("groups_in_flight", "gauge", [("", scheduler.groups_in_flight)])
            metric("episodes_in_flight", "gauge", [("", scheduler.episodes_in_flight)])
            metric("group_queue_depth", "gauge", [("", scheduler.queue_depth)])
            metric("steps_per_second", "gauge", [("", scheduler.steps_per_s)])
        return "\n".join(out) + "\n"


def read_events(path: Path) -> list[Event]:
    """Every event in a metrics.jsonl file; a torn last line (crash mid-write) is skipped."""
    events: list[Event] = []
    lines = path.read_bytes().splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            events.append(decode_event(line))
        except ValueError:
            if number == len(lines):
                break
            raise
    return events


class CurvePlotter:
    """Redraws `<run_dir>/learning_curve.png` from `metrics.jsonl` when wanted, at most
    once every `every_s` (matplotlib costs ~0.3 s a figure); a failed drawing is logged,
    never a reason to stop training."""

    def __init__(self, run_dir: Path, *, every_s: float = 10.0) -> None:
        self.metrics_path = run_dir / "metrics.jsonl"
        self.png_path = run_dir / "learning_curve.png"
        self.every_s = every_s
        self._wanted = anyio.Event()

    def want(self) -> None:
        self._wanted.set()

    async def run(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted = anyio.Event()
            await self.draw()
            await anyio.sleep(self.every_s)

    async def draw(self) -> None:
        try:
            await anyio.to_thread.run_sync(plot_learning_curve, self.metrics_path, self.png_path)
        except Exception as exc:
            log.warning("daemon.plot_failed", error=repr(exc))


def plot_learning_curve(metrics_path: Path, png_path: Path) -> None:
    """Draw success (train groups, test, ood), tokens per turn and swap latency over updates.

    Written to a temporary file and renamed, so a reader never sees half a PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = read_events(metrics_path)
    update = 0
    train_x: list[int] = []
    train_y: list[float] = []
    window: list[float] = []
    tokens_x: list[int] = []
    tokens_y: list[float] = []
    evals: dict[str, tuple[list[int], list[float]]] = {}
    swaps_x: list[int] = []
    swaps_y: list[float] = []
    for event in events:
        match event:
            case GroupReady(rewards=rewards):
                window.extend(rewards)
            case EpisodeFinished(turns=turns, prompt_tokens=tokens) if turns:
                tokens_x.append(update)
                tokens_y.append(tokens / turns)
            case UpdateApplied():
                if window:
                    train_x.append(update)
                    train_y.append(statistics.fmean(window))
                    window = []
                update += 1
            case EvalFinished(split=split, success=success):
                xs, ys = evals.setdefault(split, ([], []))
                xs.append(update)
                ys.append(success)
            case AdapterSwapped(latency_s=latency):
                swaps_x.append(update)
                swaps_y.append(latency * 1000)
    if window:
        train_x.append(update)
        train_y.append(statistics.fmean(window))

    fig, (ax_s, ax_t, ax_l) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    ax_s.plot(train_x, train_y, ".-", label="train groups")
    for split, (xs, ys) in sorted(evals.items()):
        ax_s.plot(xs, ys, "o-", label=split)
    ax_s.set_ylabel("success")
    ax_s.set_ylim(-0.02, 1.02)
    ax_s.legend(loc="best")
    ax_s.grid(alpha=0.3)
    ax_t.plot(tokens_x, tokens_y, ".", alpha=0.4)
    ax_t.set_ylabel("prompt tokens / turn")
    ax_t.grid(alpha=0.3)
    ax_l.plot(swaps_x, swaps_y, "o")
    ax_l.set_ylabel("adapter swap (ms)")
    ax_l.set_xlabel("update")
    ax_l.grid(alpha=0.3)
    fig.suptitle(f"{metrics_path.parent.name}: {update} updates")
    fig.tight_layout()
    tmp = png_path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(png_path)
