"""What `bench.learning` reads from its runs and how it compares arms: success over seeds
(`success_stats`), two arms task by task (`paired_difference`, from each task's rate in a
`webagent eval` results file, `task_rates`; its error with tasks grouped by template,
`clustered_se`, `task_templates`), the learning curves of a daemon's events
(`curves`), and the files it reads them from (`read_jsonl`, `newest_adapter`). Pure: no
process, no network.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from runtime.base.messages import EVALUATED_STATUSES

__all__ = [
    "clustered_se",
    "curves",
    "newest_adapter",
    "paired_difference",
    "read_jsonl",
    "success_stats",
    "task_rates",
    "task_templates",
]

_ADAPTER = re.compile(r"@v(\d+)$")


def success_stats(cells: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """Success over seeds: `cells` holds (successes, episodes) per seed.

    success: over all episodes; se: binomial standard error sqrt(p(1-p)/n) over them;
    se_seeds: standard deviation of the per-seed rates / sqrt(seeds) (NaN under 2 seeds).
    """
    episodes = sum(e for _, e in cells)
    successes = sum(s for s, _ in cells)
    p = successes / episodes if episodes else float("nan")
    se = math.sqrt(p * (1 - p) / episodes) if episodes else float("nan")
    rates = [s / e for s, e in cells if e]
    se_seeds = statistics.stdev(rates) / math.sqrt(len(rates)) if len(rates) >= 2 else float("nan")
    return {"success": p, "se": se, "se_seeds": se_seeds, "episodes": episodes,
            "successes": successes, "per_seed": rates}  # fmt: skip


def paired_difference(
    a: Mapping[tuple[int, int], float],
    b: Mapping[tuple[int, int], float],
    templates: Mapping[tuple[int, int], Any] | None = None,
) -> dict[str, Any]:
    """Arm a against arm b on the tasks both were evaluated on: `a` and `b` map
    (seed, task_id) to a task's success rate. The arms ran the same tasks in the same
    worlds, so the per-task differences carry the comparison: their mean, its standard
    error (sample standard deviation / sqrt(tasks)), the tasks only one arm solved, and
    the two-sided sign test's p-value over those (exact binomial, p = 1/2): far tighter
    than two independent binomial errors when most tasks go the same way for both.
    `template_se`: `clustered_se` with the tasks grouped by `templates`, NaN unless it
    names the template of every shared task."""
    keys = sorted(set(a) & set(b))
    diffs = [a[k] - b[k] for k in keys]
    n = len(diffs)
    only_a, only_b = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    mean = sum(diffs) / n if n else float("nan")
    se = statistics.stdev(diffs) / math.sqrt(n) if n >= 2 else float("nan")
    split = only_a + only_b
    tail = sum(math.comb(split, k) for k in range(min(only_a, only_b) + 1)) / 2**split
    grouped = clustered_se(a, b, templates or {})
    template_se = grouped["se"] if grouped["tasks"] == n else float("nan")
    return {"tasks": n, "difference": mean, "se": se, "only_a": only_a, "only_b": only_b,
            "sign_p": min(1.0, 2 * tail), "template_se": template_se}  # fmt: skip


def clustered_se(
    a: Mapping[Any, float], b: Mapping[Any, float], cluster_of: Mapping[Any, Any]
) -> dict[str, Any]:
    """The standard error of `paired_difference`'s mean with the tasks grouped by
    `cluster_of` (a task -> its template), over the tasks both arms ran and the map names.

    Greedy success moves template by template (a policy that learns or forgets a template
    wins or loses most of its tasks at once), so tasks of one template are not independent
    draws: the error is sqrt(C/(C-1) * sum over clusters of (sum of d - mean)^2) / n, the
    cluster-robust form with its small-sample factor, over C clusters of n tasks. With one
    task a cluster it is `paired_difference`'s error."""
    keys = [k for k in sorted(set(a) & set(b)) if k in cluster_of]
    n = len(keys)
    if n == 0:
        return {"tasks": 0, "clusters": 0, "se": float("nan")}
    mean = sum(a[k] - b[k] for k in keys) / n
    sums: dict[Any, float] = {}
    for k in keys:
        sums[cluster_of[k]] = sums.get(cluster_of[k], 0.0) + a[k] - b[k] - mean
    c = len(sums)
    se = math.sqrt(c / (c - 1) * sum(v * v for v in sums.values())) / n if c >= 2 else float("nan")
    return {"tasks": n, "clusters": c, "se": se}


def task_templates(results: Path) -> dict[int, int | str]:
    """task_id -> its template, for the lines of a `webagent eval` results.jsonl that name
    one (`intent_template_id`; older results do not)."""
    return {
        int(row["task_id"]): row["intent_template_id"]
        for row in read_jsonl(results)
        if row.get("intent_template_id") is not None
    }


def task_rates(results: Path) -> dict[int, float]:
    """task_id -> success over the scored episodes of a `webagent eval` results.jsonl, by
    `Trajectory.scored`'s rule: judged, and ended by the policy (`EVALUATED_STATUSES`), not by
    the infrastructure (`error:*`: a policy call that timed out on a loaded server, a
    crashed browser; `interrupted`), which says nothing of the policy. A task with no such
    episode is left out, so a pair of arms is compared on the tasks both ran."""
    rates: dict[int, float] = {}
    for row in read_jsonl(results):
        scored = [
            e for e in row["episodes"]
            if e["status"] in EVALUATED_STATUSES and not e.get("unjudged")
        ]  # fmt: skip
        if scored:
            rates[int(row["task_id"])] = sum(e["reward"] > 0 for e in scored) / len(scored)
    return rates


def newest_adapter(folder: Path) -> tuple[int, Path] | None:
    """(version, path) of the newest `*@vN` folder holding a manifest.json, if any."""
    best: tuple[int, Path] | None = None
    if not folder.is_dir():
        return None
    for path in folder.iterdir():
        match = _ADAPTER.search(path.name)
        if match and (path / "manifest.json").is_file():
            version = int(match.group(1))
            if best is None or version > best[0]:
                best = (version, path)
    return best


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of `path`; a torn last line (a killed writer) is skipped."""
    if not path.is_file():
        return []
    out: list[dict[str, Any]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if number != len(lines):
                raise
    return out


def curves(events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Learning curves from a daemon's events (metrics.jsonl).

    intervals[k]: the groups that finished after update k and before update k+1 (k = 0:
    before the first): their number, mean reward over all their episodes, and the
    fraction with mixed rewards (the only ones M-GRPO learns from). updates[k-1]: the
    metrics of update k (loss, clip_fraction, approx_kl, reward_mean of the trained groups).
    """
    keys = ("loss", "clip_fraction", "approx_kl", "reward_mean", "grad_norm", "critic_loss")
    cells: list[dict[str, Any]] = [{"update": 0, "rewards": [], "groups": 0, "mixed": 0}]
    updates: list[dict[str, Any]] = []
    start: float | None = None
    for event in events:
        kind, at = event.get("event"), float(event.get("at", 0.0))
        start = at if start is None else start
        if kind == "GroupReady":
            rewards = [float(r) for r in event.get("rewards", [])]
            cells[-1]["groups"] += 1
            cells[-1]["rewards"].extend(rewards)
            cells[-1]["mixed"] += int(len(set(rewards)) > 1)
        elif kind == "UpdateApplied":
            metrics = event.get("metrics", {})
            updates.append({"update": len(updates) + 1, "minutes": (at - start) / 60,
                            "groups_trained": event.get("groups_trained", 0),
                            **{k: float(metrics[k]) for k in keys if k in metrics}})  # fmt: skip
            cells.append({"update": len(updates), "rewards": [], "groups": 0, "mixed": 0})
    for cell in cells:
        rewards, groups = cell.pop("rewards"), cell["groups"]
        cell["reward_mean"] = sum(rewards) / len(rewards) if rewards else float("nan")
        cell["mixed_fraction"] = cell["mixed"] / groups if groups else float("nan")
    return {"intervals": [c for c in cells if c["groups"]], "updates": updates,
            "groups": sum(c["groups"] for c in cells),
            "mixed_groups": sum(c["mixed"] for c in cells)}  # fmt: skip
