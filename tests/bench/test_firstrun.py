"""bench/firstrun.py: stages told apart by the run's own log events, PSS split by part."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

from bench import firstrun


def _line(event: str, **fields: object) -> str:
    return json.dumps({"event": event, "level": "info", **fields}) + "\n"


def test_log_events_open_stages_in_order_and_later_updates_do_not() -> None:
    watch = firstrun.Watch(started=time.monotonic())
    watch.enter("venv and Chromium (make setup)", watch.started)
    stream = io.StringIO(
        "pip install ...\n"  # make's own lines are copied to the log, not parsed
        + _line("bootstrap.base_model", out="x")
        + _line("bootstrap.base_model_done", name="SmolLM2")  # no stage of its own
        + _line("bootstrap.demos", tasks=500)
        + "{not json\n"
        + _line("bootstrap.bc")
        + _line("bootstrap.bc_done", steps=140)
        + _line("daemon.learner_ready", version=0)
        + _line("learner.update", version=1)
        + _line("learner.update", version=2)
    )
    log = io.StringIO()
    firstrun._read(stream, watch, log)
    assert [s.name for s in watch.stages] == [
        "venv and Chromium (make setup)",
        "convert SmolLM2",
        "demonstrations",
        "behaviour cloning",
        "vLLM start, learner load",
        "rollouts to the first update",
        "after the first update",
    ]
    assert watch.updates == 2
    assert log.getvalue() == stream.getvalue()  # every line is kept


def test_sample_splits_the_tree_by_part_and_keeps_each_stage_peak() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; b = b'x' * (64 << 20); time.sleep(30)"]
    )
    try:
        deadline = time.monotonic() + 10
        watch = firstrun.Watch(started=time.monotonic())
        watch.enter("one", watch.started)
        while time.monotonic() < deadline:
            watch.sample(child.pid)  # a tree of its own: no browser another test left
            if watch.stages[0].peak["daemon"] > 64 << 20:
                break
            time.sleep(0.1)
        peak = watch.stages[0].peak
        assert peak["daemon"] > 64 << 20  # the child's 64 MiB, written
        assert peak["vllm"] == 0 and peak["chromium"] == 0
        assert peak["total"] == peak["daemon"]
    finally:
        child.kill()
        child.wait()


def test_run_facts_say_what_bc_reached_and_what_the_rollouts_solved(tmp_path: Path) -> None:
    log = tmp_path / "firstrun.log"
    log.write_text(
        "make: building\n"
        '{"steps": 50, "tokens_per_s": 289, "heldout_accuracy": 0.7115, '
        '"heldout_whole_accuracy": 0.1875, "heldout_loss": 0.25612, '
        '"event": "bootstrap.bc_done"}\n'
    )
    run_dir = tmp_path / "runs" / "default"
    run_dir.mkdir(parents=True)
    (run_dir / "config.toml").write_text("[learner]\nbatch_groups = 3\n")
    # One group also holds an infrastructure failure: not a reward of the policy's, so that
    # group's evaluated rewards are all 0 and it is not mixed.
    scored = [
        [(0.0, "exited")] * 4,
        [(1.0, "exited"), (0.0, "max_turns"), (0.0, "exited"), (1.0, "exited")],
        [(1.0, "exited")] * 3 + [(1.0, "repeated_actions")],
        [(0.0, "exited")] * 3 + [(1.0, "error:browser")],
    ]
    groups = [
        {"group_id": f"g{i}", "task_id": i, "created_at": 1.0, "split": "train",
         "trajectories": [{"episode_id": f"g{i}-{j}", "group_id": f"g{i}", "task_id": i,
                           "intent": "x", "reward": r, "status": s}
                          for j, (r, s) in enumerate(episodes)]}
        for i, episodes in enumerate(scored)
    ]  # fmt: skip
    (run_dir / "trajectories.jsonl").write_text("".join(json.dumps(g) + "\n" for g in groups))
    assert firstrun.run_facts(tmp_path, log) == [
        "BC: 50 steps at 289 trained tokens/s, held-out demonstrated actions right 71% "
        "(teacher-forced), whole replies 19%, reply NLL 0.256",
        "training rollouts: 4 groups, 7 of 16 episodes solved, 1 groups with mixed rewards "
        "(an update trains on 3)",
    ]
