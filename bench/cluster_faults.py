"""Faults on the Ray backend: rollout workers and a vLLM replica SIGKILLed under training.

    .venv/bin/python -m bench.cluster_faults [--model PATH] [--workers 2] [--worker-kills 2]
                                             [--interval-s 30] [--restart-replica]
                                             [--out bench/out]

`webagent train` runs as a user runs it, with `cluster.backend = "ray"` (a local Ray
cluster, `--workers` rollout-worker actors) and `cluster.replica_urls` naming two vLLM-CPU
servers started here with the command the runtime itself would run (`--model`, default
the test suite's tiny model: its turns are nonsense, which does not matter here). Once
groups flow, every `--interval-s` seconds:

1. `--worker-kills` times, a rollout worker's process is SIGKILLed (the one with the
   lowest pid); measured from the kill: when the driver logged its first lost group and
   when the worker answered again (`worker.lost_group`, `worker.restarted` in the log);
2. replica B is SIGKILLed (its process group); measured: when the driver took it out
   (`replica.down`) and the first group finished after the kill;
3. with `--restart-replica`, replica B is started again on its port; measured: when it
   rejoined (`replica.rejoined`, after the resident adapters were loaded into it).

Then SIGTERM: the daemon drains and exits. From its store and log: groups finished
(`scheduler.finished`) against groups stored (lost: the difference), groups lost with a
worker (`error:worker`: stored, never trained, their tasks run again), episodes that
ended `error:policy` (turns that failed for want of a server), and groups trained twice
(the learner's `learner.update` group ids). Prints a table; writes the JSON to `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common import LoadSampler, descendants, finish, tiny_model
from policy.server import server_command, server_env
from runtime.base.config import PolicyConfig
from runtime.base.http import free_port

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]


def _start_replica(model: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    config = PolicyConfig(max_model_len=2048)
    with log.open("ab") as out:
        return subprocess.Popen(
            server_command(config, model=model, port=port),
            env=server_env(config, model=model), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 600) -> None:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"the replica at {url} exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise RuntimeError(f"the replica at {url} was not healthy within {timeout_s:.0f} s")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _log(path: Path, event: str) -> list[dict[str, Any]]:
    """The daemon's JSON log lines of `event`, with `at` (epoch seconds) added."""
    out = []
    for line in path.read_text().splitlines():
        if f'"{event}"' not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        record["at"] = datetime.fromisoformat(record["timestamp"]).timestamp()
        out.append(record)
    return out


def _first_after(path: Path, event: str, at: float, timeout_s: float, **match: str) -> float:
    """Seconds from `at` to the first `event` logged after it (matching `match`); NaN if
    none came within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for record in _log(path, event):
            if record["at"] >= at and all(record.get(k) == v for k, v in match.items()):
                return round(float(record["at"]) - at, 2)
        time.sleep(0.2)
    return float("nan")


def _ray_workers(daemon: int) -> list[int]:
    pids = []
    for pid in descendants(daemon):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"ray::RolloutWorker" in title:
            pids.append(pid)
    return sorted(pids)


def _groups_ready_after(run_dir: Path, at: float, timeout_s: float) -> float:
    """Seconds from `at` to the first group finished after it (NaN: none in `timeout_s`)."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in metrics.read_text().splitlines() if metrics.exists() else []:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # being written
            if event.get("event") == "GroupReady" and event["at"] >= at:
                return round(float(event["at"]) - at, 2)
        time.sleep(0.5)
    return float("nan")


def _config(run_dir: Path, model: str, replicas: Sequence[str], workers: int) -> Path:
    path = run_dir.with_suffix(".toml")
    urls = ", ".join(f'"{url}"' for url in replicas)
    path.write_text(
        f"""
[policy]
model = "{model}"
max_model_len = 2048
max_tokens = 48
[scheduler]
group_size = 4
max_groups_in_flight = {2 * workers}
max_turns = 4
[learner]
batch_groups = 1
optimizer_steps = 1
torch_threads = 1
[daemon]
run_dir = "{run_dir}"
eval_every = 0
drain_timeout_s = 30.0
[endpoint]
port = {free_port()}
[cluster]
backend = "ray"
workers = {workers}
contexts_per_worker = 4
replica_urls = [{urls}]
"""
    )
    return path


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = args.model or str(tiny_model(args.out))
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    replicas = [
        _start_replica(model, port, work / f"replica-{i}.log") for i, port in enumerate(ports)
    ]
    faults: list[dict[str, Any]] = []
    daemon: subprocess.Popen[bytes] | None = None
    run_dir = work / f"run-{time.strftime('%H%M%S')}"
    log = run_dir.with_suffix(".log")
    try:
        for url, proc in zip(urls, replicas, strict=True):
            _wait_healthy(url, proc)
        config = _config(run_dir, model, urls, args.workers)
        with log.open("ab") as out:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "runtime.cli", "--log-format", "json", "train",
                 "--config", str(config)],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
            )  # fmt: skip
        started = time.time()
        if math.isnan(_groups_ready_after(run_dir, started, 900)):
            raise RuntimeError(f"no group finished within 900 s; log: {log}")
        print(f"groups flow {time.time() - started:.0f} s after the start; a fault every "
              f"{args.interval_s:.0f} s")  # fmt: skip
        for _ in range(args.worker_kills):
            time.sleep(args.interval_s)
            workers = _ray_workers(daemon.pid)
            if not workers:
                raise RuntimeError(f"no rollout worker under the daemon; log: {log}")
            at = time.time()
            os.kill(workers[0], signal.SIGKILL)
            faults.append(
                {
                    "fault": "worker SIGKILL",
                    "detected_s": _first_after(log, "worker.lost_group", at, 120),
                    "recovered_s": _first_after(log, "worker.restarted", at, 300),
                }
            )
            print(faults[-1])
        time.sleep(args.interval_s)
        at = time.time()
        _kill_group(replicas[1])
        faults.append(
            {
                "fault": "replica SIGKILL",
                "detected_s": _first_after(log, "replica.down", at, 120, url=urls[1]),
                "recovered_s": _groups_ready_after(run_dir, at, 300),
            }
        )
        print(faults[-1])
        if args.restart_replica:
            time.sleep(args.interval_s)
            at = time.time()
            replicas[1] = _start_replica(model, ports[1], work / "replica-1.log")
            _wait_healthy(urls[1], replicas[1])
            faults.append(
                {
                    "fault": "replica restarted",
                    "detected_s": round(time.time() - at, 2),  # healthy again
                    "recovered_s": _first_after(log, "replica.rejoined", at, 120, url=urls[1]),
                }
            )
            print(faults[-1])
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=300)
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait(timeout=30)
        for proc in replicas:
            _kill_group(proc)
    return {"faults": faults, "exit_code": code, "log": str(log), **_tally(run_dir, log)}


def _tally(run_dir: Path, log: Path) -> dict[str, Any]:
    groups = [
        json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()
    ]
    statuses = [t["status"] for g in groups for t in g["trajectories"]]
    trained = [g for line in _log(log, "learner.update") for g in line["group_ids"]]
    finished = [line["groups"] for line in _log(log, "scheduler.finished")]
    return {
        "groups_finished": finished[-1] if finished else None,
        "groups_stored": len(groups),
        "groups_lost_with_a_worker": sum(
            all(t["status"] == "error:worker" for t in g["trajectories"]) for g in groups
        ),
        "episodes": len(statuses),
        "episodes_error_policy": statuses.count("error:policy"),
        "groups_trained": len(trained),
        "groups_trained_twice": len(trained) - len(set(trained)),
    }


def main(argv: Sequence[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="", help="model folder (default: the tiny model)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker-kills", type=int, default=2)
    parser.add_argument("--interval-s", type=float, default=30.0)
    parser.add_argument(
        "--restart-replica", action="store_true",
        help="start the killed replica again and time its rejoin (on 2 cores its engine "
        "start hung for 10 minutes under the running daemon, 2026-12-03)",
    )  # fmt: skip
    parser.add_argument("--work", default="/tmp/webagent-cluster-faults")
    parser.add_argument("--out", default="bench/out")
    args = parser.parse_args(argv)
    load = LoadSampler()
    with load:
        result = run(args)
    rows = [[f["fault"], f["detected_s"], f["recovered_s"]] for f in result["faults"]]
    table = {
        "title": "faults under `webagent train` on Ray, 2 vLLM-CPU replicas (s from each fault)",
        "headers": ["fault", "detected s", "recovered s"],
        "rows": rows,
    }
    lost = (result["groups_finished"] or 0) - result["groups_stored"]
    notes = [
        "detected: worker = its first lost group logged; replica killed = taken out of the "
        "driver's set; replica restarted = healthy again",
        "recovered: worker = answering again after Ray's restart; replica killed = the first "
        "group finished after the kill; replica restarted = rejoined with its adapters",
        f"groups finished {result['groups_finished']}, stored {result['groups_stored']} "
        f"(lost {lost}); lost with a worker (error:worker, never trained, rerun) "
        f"{result['groups_lost_with_a_worker']}; episodes error:policy "
        f"{result['episodes_error_policy']} of {result['episodes']}; groups trained "
        f"{result['groups_trained']}, twice {result['groups_trained_twice']}; daemon exit "
        f"code {result['exit_code']} after SIGTERM",
    ]
    return finish(args.out, "cluster_faults", result, table=table, notes=notes, load=load)


if __name__ == "__main__":
    main()
