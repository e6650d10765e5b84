"""bench/cluster_sim.py: the simulated rollout worker's results, and the simulation part on Ray
(through `python -m bench.cluster`)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bench import cluster_sim
from runtime import cluster
from runtime.base.messages import TaskConfig

ROOT = Path(__file__).resolve().parents[2]


def _task() -> bytes:
    return msgspec.msgpack.encode(
        TaskConfig(task_id=3, intent="Find the order.", start_url="http://127.0.0.1:7770/")
    )


def test_sim_worker_returns_what_a_rollout_worker_returns() -> None:
    spec = cluster_sim.SimSpec(turns=3, think_s=0.0, action_s=0.0, prompt_ids=50, completion_ids=7)
    worker = cluster_sim.SimWorker(msgspec.msgpack.encode(spec))
    raw = worker.run_group(_task(), 4, "train", "g1", b"")
    done = msgspec.msgpack.Decoder(cluster._GroupDone).decode(raw)  # the driver's type
    group = done.group
    assert group.group_id == "g1" and group.task_id == 3 and group.split == "train"
    assert [t.episode_id for t in group.trajectories] == [f"g1-{i}" for i in range(4)]
    assert {t.status for t in group.trajectories} == {"exited"}
    assert group.rewards_differ()
    for t in group.trajectories:
        assert len(t.turns) == 3
        assert all(len(turn.prompt_token_ids) == 50 for turn in t.turns)
        assert all(len(turn.completion_token_ids) == 7 for turn in t.turns)
        assert all(len(turn.completion_logprobs) == 7 for turn in t.turns)
    # Per episode: started, a turn each, finished; then the group.
    assert len(done.events) == 4 * (3 + 2) + 1
    assert type(done.events[-1]).__name__ == "GroupReady"


def test_sim_worker_interrupt_ends_a_sleeping_group() -> None:
    spec = cluster_sim.SimSpec(turns=4, think_s=20.0, action_s=0.0)
    worker = cluster_sim.SimWorker(msgspec.msgpack.encode(spec))
    out: list[bytes] = []
    thread = threading.Thread(target=lambda: out.append(worker.run_group(_task(), 2, "", "g", b"")))
    started = time.monotonic()
    thread.start()
    while not worker._running:
        time.sleep(0.01)
    worker.interrupt_all()
    thread.join(timeout=10)
    assert time.monotonic() - started < 10 and out
    group = msgspec.msgpack.Decoder(cluster._GroupDone).decode(out[0]).group
    assert {t.status for t in group.trajectories} == {"interrupted"}
    assert all(len(t.turns) < 4 for t in group.trajectories)


def _level(workers: int, groups_per_s: float, share: float, efficiency: float) -> dict[str, Any]:
    return {
        "workers": workers,
        "start_up_s": 1.0 * workers,
        "pss_per_worker_mib": 30.0,
        "groups_in_flight": 2 * workers,
        "episodes_in_flight_target": 16 * workers,
        "episodes_in_flight_mean": 16 * workers * min(1.0, efficiency),
        "ideal_groups_per_s": 0.5 * workers,
        "dispatched_groups_per_s": groups_per_s,
        "absorbed_groups_per_s": groups_per_s,
        "efficiency": efficiency,
        "driver_cpu_ms_per_group": share / groups_per_s * 1000,
        "driver_cpu_share": share,
        "window_s": 12.0,
    }


def test_saturation_fits_the_driver_cpu_and_reports_limits() -> None:
    # 0.01 core idle + 10 ms a group; N=16 fell behind with the driver at 0.1 core.
    levels = [
        _level(4, 2.0, 0.03, 1.0),
        _level(8, 4.0, 0.05, 1.0),
        _level(16, 5.0, 0.1, 0.625),
        {"workers": 32, "start_up_s": 99.0, "failed": "TimeoutError: "},
    ]
    summary = cluster_sim._saturation(levels)
    assert summary["max_workers_started"] == 16 and summary["first_failed"] == 32
    assert summary["driver_cpu_ms_per_group_fit"] == pytest.approx(10.0)
    assert summary["driver_idle_cores_fit"] == pytest.approx(0.01)
    assert summary["groups_per_s_at_one_core"] == pytest.approx(99.0)
    assert summary["workers_at_one_core"] == pytest.approx(198.0)  # 0.5 groups/s a worker
    assert summary["episodes_at_one_core"] == pytest.approx(198 * 16)
    assert summary["max_episodes_sustained"] == 128
    assert summary["machine_limited"] == [16]
    result = {
        "levels": levels,
        "group_size": 8,
        "spec": {"turns": 8},
        "group_s": 4.0,
        "payload_kib_per_group": 290.0,
        **summary,
    }
    table = cluster_sim.scale_table(result)
    assert [row[0] for row in table["rows"]] == [4, 8, 16, 32]
    assert table["rows"][3][2] == "start-up failed"
    assert all(len(row) == len(table["headers"]) for row in table["rows"])
    notes = cluster_sim.scale_notes(result)
    assert "start-up failed at 32" in notes[0]
    assert "~99 groups/s" in notes[1] and "N = [16]" in notes[-1]
    assert "(4, 24)" not in " ".join(notes)  # 2 groups/s x 12 s counted enough
    # One level alone: its CPU per group is the cost.
    alone = cluster_sim._saturation([_level(4, 2.0, 0.02, 1.0)])
    assert alone["groups_per_s_at_one_core"] == pytest.approx(100.0)


def test_simulation_part_runs_on_a_local_ray_cluster(tmp_path: Path) -> None:
    """Two simulated workers behind the real RayRollout and Scheduler: groups come back,
    and the JSON holds the scale table and numbers."""
    pytest.importorskip("ray")
    command = [
        sys.executable, "-m", "bench.cluster", "--skip-overhead", "--workers", "1,2",
        "--turns", "2", "--think-s", "0.2", "--action-s", "0.1", "--waves", "2",
        "--out", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(
        command, check=False, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "one driver, N simulated rollout workers" in done.stdout
    (path,) = tmp_path.glob("cluster-*.json")
    record = json.loads(path.read_text())
    assert record["bench"] == "cluster" and "overhead" not in record
    scale = record["scale"]
    assert [e["workers"] for e in scale["levels"]] == [1, 2]
    for entry in scale["levels"]:
        assert entry["groups_consumed"] > 0 and entry["groups_lost"] == 0
        assert entry["absorbed_groups_per_s"] > 0 and entry["dispatched_groups_per_s"] > 0
        assert entry["turns_consumed"] > 0 and entry["events_consumed"] > 0
        assert entry["driver_cpu_ms_per_group"] > 0
    assert scale["max_workers_started"] == 2
    assert record["scale_table"]["headers"][0] == "workers"
    assert len(record["scale_table"]["rows"]) == 2
    assert record["table"] == record["scale_table"]
