"""kill -9 of a learner process at several points; each restart resumes where it was.

The worker (`resume_worker.py`) trains 12 groups in batches of 2 (6 updates). It is
killed (SIGKILL) during an update, right after a publish, and at a random moment, then
run to the end. The final state must equal an uninterrupted run's: same version, every
group trained exactly once by the same update, and bit-identical adapter weights.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from learner.checkpoint import latest_checkpoint
from learner.lora import verify_adapter
from runtime.base.messages import TrajectoryGroup, encode

WORKER = Path(__file__).with_name("resume_worker.py")
GROUPS = 12
UPDATES = 6


_LIVE: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_orphans() -> Iterator[None]:
    """Whatever happens in the test, no worker outlives it."""
    yield
    while _LIVE:
        proc = _LIVE.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def start(model: Path, out: Path, store: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(model), str(out), str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    _LIVE.append(proc)
    return proc


def lines_until(
    proc: subprocess.Popen[str], stop: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """Read JSON log lines until `stop(line)` holds (or the process ends)."""
    assert proc.stdout is not None
    seen = []
    for raw in proc.stdout:
        if not raw.startswith("{"):
            continue
        line = json.loads(raw)
        seen.append(line)
        if stop(line):
            break
    return seen


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    finish(proc, -signal.SIGKILL)


def finish(proc: subprocess.Popen[str], code: int = 0) -> None:
    assert proc.wait(timeout=120) == code
    assert proc.stdout is not None
    proc.stdout.close()


def on_disk_version(out: Path) -> int | None:
    saved = latest_checkpoint(out / "checkpoints")
    return None if saved is None else saved.state.version


def started_version(lines: list[dict[str, Any]]) -> int:
    return next(x["version"] for x in lines if x["event"] == "learner.started")


@pytest.mark.slow
@pytest.mark.timeout(600)  # ~40 s on idle cores; five process starts crawl on loaded ones
def test_sigkill_anywhere_then_restart_loses_and_repeats_nothing(
    tmp_path: Path, tiny_model_dir: Path, make_group: Callable[..., TrajectoryGroup]
) -> None:
    store = tmp_path / "trajectories.jsonl"
    store.write_bytes(
        b"".join(
            encode(
                make_group(
                    s,
                    group_id=f"g{s:02d}",
                    rewards=[1.0, 0.0, float(s % 2)],
                    vocab=500,
                    prompt_len=(40, 80),
                    completion_len=(4, 12),
                )
            )
            + b"\n"
            for s in range(GROUPS)
        )
    )
    out = tmp_path / "killed"
    rng = random.Random(0)
    resumed_at: list[tuple[int | None, int]] = []

    # 1: killed during the update that makes v2
    proc = start(tiny_model_dir, out, store)
    lines_until(proc, lambda x: x["event"] == "learner.update_started" and x["version"] == 1)
    kill(proc)
    # 2: killed right after a publish (between updates, or as the next one starts)
    before = on_disk_version(out)
    proc = start(tiny_model_dir, out, store)
    seen = lines_until(
        proc, lambda x: x["event"] == "worker.published" and x["name"] != "policy@v1"
    )
    resumed_at.append((before, started_version(seen)))
    kill(proc)
    # 3: killed at a random moment of an update
    before = on_disk_version(out)
    proc = start(tiny_model_dir, out, store)
    seen = lines_until(proc, lambda x: x["event"] == "learner.update_started")
    time.sleep(rng.uniform(0.0, 0.3))
    kill(proc)
    resumed_at.append((before, started_version(seen)))
    # 4: to the end
    before = on_disk_version(out)
    proc = start(tiny_model_dir, out, store)
    seen = lines_until(proc, lambda x: x["event"] == "worker.done")
    finish(proc)
    resumed_at.append((before, started_version(seen)))

    # every restart resumed at the version on disk when it was killed
    for on_disk, resumed in resumed_at:
        assert on_disk is not None and resumed == on_disk
    assert [x["version"] for x in seen if x["event"] == "worker.done"] == [UPDATES]

    saved = latest_checkpoint(out / "checkpoints")
    assert saved is not None and saved.state.version == UPDATES
    trained = saved.state.ledger.trained
    assert sorted(trained) == [f"g{s:02d}" for s in range(GROUPS)]
    # each update trained exactly 2 groups: a group trained twice would leave one short
    assert Counter(trained.values()) == {v: 2 for v in range(1, UPDATES + 1)}
    # no orphans, no temporary folders
    names = sorted(p.name for p in (out / "adapters").iterdir())
    assert names == sorted(f"policy@v{v}" for v in range(UPDATES + 1))

    # same result as a run that was never interrupted
    ref = tmp_path / "reference"
    proc = start(tiny_model_dir, ref, store)
    lines_until(proc, lambda x: x["event"] == "worker.done")
    finish(proc)
    ref_saved = latest_checkpoint(ref / "checkpoints")
    assert ref_saved is not None and ref_saved.state.ledger.trained == trained
    final = verify_adapter(out / "adapters" / f"policy@v{UPDATES}")
    want = verify_adapter(ref / "adapters" / f"policy@v{UPDATES}")
    assert final.weights_sha256 == want.weights_sha256
