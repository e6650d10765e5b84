"""Shared helpers of the benchmarks: tables, statistics, memory, load, and the JSON record.

Every benchmark writes one JSON file `{out}/{bench}-{YYYYmmdd-HHMMSS}.json` holding

    bench     the benchmark's name ("rollout", "learner", ...)
    command   the command line that reproduces it
    machine   CPU count, CPU model name, load average before and during the run
    table     {"title", "headers", "rows"}: what the benchmark printed last
    notes     lines printed under the table (ratios, caveats)
    ...       the benchmark's raw numbers

and `bench/results.py` turns the newest file of each benchmark into the tables of docs/results.md.

Memory is PSS (proportional set size) summed over a process and all its descendants
(Chromium's renderers, vLLM's workers): shared pages are divided among the processes that
map them, so the sum does not count them several times, unlike summed RSS.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import statistics
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.base.files import write_atomic

__all__ = [
    "LoadSampler",
    "command_line",
    "cpu_model",
    "descendants",
    "finish",
    "format_cell",
    "format_table",
    "load_note",
    "machine_info",
    "median",
    "percentile",
    "pss_bytes",
    "pss_tree",
    "tiny_model",
    "with_style",
    "write_result",
]


def median(values: Iterable[float]) -> float:
    """The median, NaN for no values."""
    items = list(values)
    return statistics.median(items) if items else float("nan")


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (`q` in [0, 1]) of `values`; NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must lie in [0, 1], not {q}")
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str = "") -> str:
    """A plain-text table: right-aligned columns, floats with 3 significant decimals."""
    cells = [[str(h) for h in headers]] + [[format_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [title] if title else []
    for k, row in enumerate(cells):
        lines.append("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_cell(value: object) -> str:
    """A table cell: floats to 3 significant digits (integers above 100), NaN as n/a."""
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if value == 0 or abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)


# --------------------------------------------------------------------------- processes


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (children, grandchildren, ...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes().decode("utf-8", "replace")
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields follow the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1:
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        out.extend(children)
        todo.extend(children)
    return out


def pss_bytes(pid: int) -> int:
    """PSS of one process from /proc/<pid>/smaps_rollup; 0 if it is gone or unreadable."""
    try:
        with Path(f"/proc/{pid}/smaps_rollup").open(encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0
    return 0


def pss_tree(pid: int | None = None) -> int:
    """PSS of `pid` (default: this process) and all its descendants, in bytes."""
    root = os.getpid() if pid is None else pid
    return sum(pss_bytes(p) for p in [root, *descendants(root)])


@dataclass
class LoadSampler:
    """Samples the process tree's PSS and the 1-minute load average in a thread.

    Use as a context manager around the measured work; `peak_pss` is the largest tree
    PSS seen (bytes), `loads` the load averages seen. Sampling costs ~1-5 ms a time.
    """

    interval_s: float = 0.5
    pid: int | None = None
    peak_pss: int = 0
    loads: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        self.peak_pss = max(self.peak_pss, pss_tree(self.pid))
        self.loads.append(os.getloadavg()[0])

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> LoadSampler:
        self.sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    @property
    def peak_pss_mib(self) -> float:
        return self.peak_pss / 2**20

    @property
    def load_mean(self) -> float:
        return sum(self.loads) / len(self.loads) if self.loads else float("nan")

    @property
    def load_max(self) -> float:
        return max(self.loads, default=float("nan"))


# --------------------------------------------------------------------------- machine


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform's processor name otherwise)."""
    try:
        with Path("/proc/cpuinfo").open(encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(load: LoadSampler | None = None) -> dict[str, Any]:
    """CPU count, model name, memory, and the load average now (and during `load`)."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "load_now": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        with Path("/proc/meminfo").open(encoding="utf-8") as handle:
            total_kib = int(handle.readline().split()[1])
        info["memory_gib"] = round(total_kib / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    if load is not None and load.loads:
        info["load_during_mean"] = round(load.load_mean, 2)
        info["load_during_max"] = round(load.load_max, 2)
    return info


def command_line(argv: Sequence[str] | None = None) -> str:
    """How this benchmark was started, as a shell command from the repository root."""
    args = list(sys.argv if argv is None else argv)
    script = Path(args[0]) if args else Path()
    if script.suffix == ".py" and script.resolve().parent == Path(__file__).resolve().parent:
        args = ["-m", f"bench.{script.stem}", *args[1:]]  # how the benchmarks are run
    return shlex.join([".venv/bin/python", *args])


def write_result(
    out: str | Path,
    bench: str,
    result: dict[str, Any],
    *,
    table: dict[str, Any],
    notes: Sequence[str] = (),
    load: LoadSampler | None = None,
    argv: Sequence[str] | None = None,
) -> Path:
    """Write `{out}/{bench}-{stamp}.json` atomically and return its path.

    `table` is {"title", "headers", "rows"}; the record also gets the command line and the
    machine (with the load average during the run when `load` is given).
    """
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "bench": bench,
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": command_line(argv),
        "machine": machine_info(load),
        "table": table,
        "notes": list(notes),
        **result,
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = folder / f"{bench}-{stamp}.json"
    write_atomic(path, json.dumps(record, indent=1, default=str).encode())
    return path


def finish(
    out: str | Path,
    bench: str,
    result: dict[str, Any],
    *,
    table: dict[str, Any],
    notes: Sequence[str],
    load: LoadSampler,
) -> Path:
    """`write_result`, then print where, the table (last but for its notes) and the notes."""
    path = write_result(out, bench, result, table=table, notes=notes, load=load)
    print(f"wrote {path}")
    print(format_table(table["headers"], table["rows"], title=table["title"]))
    for note in notes:
        print(note)
    return path


def tiny_model(out: str | Path, seed: int = 0) -> Path:
    """The tiny model (`webagent model init --tiny`), made once under
    `{out}/cache/tiny-{seed}-{key}`, the key a digest of the model spec and tokenizer recipe
    (a new recipe, a new model)."""
    import hashlib
    import inspect

    import msgspec

    from runtime.modelinit import init_tiny_model

    defaults = inspect.signature(init_tiny_model).parameters
    spec = defaults["spec"].default
    recipe = msgspec.json.encode([spec, defaults["recipe"].default])
    key = hashlib.sha256(recipe).hexdigest()[:8]
    folder = Path(out) / "cache" / f"tiny-{seed}-{key}"
    if not (folder / "config.json").is_file():
        import anyio

        folder.parent.mkdir(parents=True, exist_ok=True)
        anyio.run(lambda: init_tiny_model(folder, seed=seed, spec=spec, overwrite=True))
    return folder


def with_style(config: Any, style: str) -> Any:
    """`config` (a runtime Config) with a concrete observation style ("html"/"compact"),
    its other "auto" choices settled for `policy.model`: the oracle reads the observation
    in the style it is rendered in."""
    import msgspec

    from policy.profile import settle_auto

    observation = msgspec.structs.replace(config.observation, style=style)
    return settle_auto(msgspec.structs.replace(config, observation=observation))


def load_note(load: LoadSampler) -> str:
    """One line saying how busy the machine was: the load before the run shows other work."""
    n = os.cpu_count() or 1
    before = load.loads[0] if load.loads else float("nan")
    busy = "; other heavy work was running" if before >= n * 0.75 else ""
    return (
        f"load average (1 min) on {n} CPUs: {before:.2f} when the run began{busy}; "
        f"mean {load.load_mean:.2f}, max {load.load_max:.2f} during it (this benchmark included)"
    )
