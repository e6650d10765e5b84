"""The trajectory store: whole groups or nothing, torn tails cut, readers never fooled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest
from structlog.testing import capture_logs

from runtime.base.messages import Action, Trajectory, TrajectoryGroup, Turn, encode
from runtime.errors import StoreError
from runtime.store import (
    STORE_FILE,
    TrajectoryStore,
    iter_group_ids,
    iter_groups,
    iter_outcomes,
    read_group,
    read_groups,
    store_path,
    unseen_groups,
)


def _group(index: int, turns: int = 3) -> TrajectoryGroup:
    trajectories = [
        Trajectory(
            episode_id=f"g{index}-{e}",
            group_id=f"g{index}",
            task_id=index,
            intent="Find the price",
            turns=[
                Turn(
                    index=t,
                    url="http://127.0.0.1:1/",
                    observation='<a id="1">x</a>\n' * 20,
                    observation_digest="d",
                    text='<think>t</think><answer>do(action="Click", element="1")</answer>',
                    action=Action(kind="do", name="Click", element=1),
                    prompt_token_ids=list(range(50)),
                    completion_token_ids=[1, 2, 3],
                    completion_logprobs=[-0.1, -0.2, -0.3],
                    adapter="policy@v1",
                    adapter_version=1,
                )
                for t in range(turns)
            ],
            reward=float(e % 2),
        )
        for e in range(4)
    ]
    return TrajectoryGroup(
        group_id=f"g{index}", task_id=index, trajectories=trajectories, created_at=1.0
    )


def test_append_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "run" / STORE_FILE
    groups = [_group(i) for i in range(5)]
    with TrajectoryStore(path) as store:
        for group in groups:
            store.append(group)
        assert store.repaired_bytes == 0
    assert list(iter_groups(path)) == groups
    assert list(iter_groups(tmp_path / "run")) == groups  # a run directory works too
    assert store_path(tmp_path / "run") == path
    assert read_group(path, "g3") == groups[3]
    with pytest.raises(KeyError, match="no group 'g9'"):
        read_group(path, "g9")
    with TrajectoryStore(path) as store:  # reopening appends after what is there
        store.append(_group(5))
    assert [g.group_id for g in iter_groups(path)] == [f"g{i}" for i in range(6)]
    with pytest.raises(StoreError, match="closed"):
        store.append(_group(6))


def test_ids_and_groups_by_id_and_the_unseen_ones(tmp_path: Path) -> None:
    """What the daemon reads at start-up: stored groups the learner never journaled."""
    path = tmp_path / STORE_FILE
    assert unseen_groups(path, lambda gid: False) == []  # no store yet
    groups = [_group(i, turns=1) for i in range(4)]
    with TrajectoryStore(path) as store:
        for group in groups:
            store.append(group)
    with path.open("ab") as handle:
        handle.write(encode(_group(9))[:-10])  # a torn tail is not a group
    assert list(iter_group_ids(path)) == ["g0", "g1", "g2", "g3"]
    assert read_groups(path, ["g3", "g1", "g7"]) == [groups[1], groups[3]]
    journaled = {"g0", "g2"}
    assert unseen_groups(path, journaled.__contains__) == [groups[1], groups[3]]


def test_outcomes_are_read_without_the_turns(tmp_path: Path) -> None:
    """What a resumed run's curriculum reads: task, split, rewards and statuses."""
    path = tmp_path / STORE_FILE
    assert list(iter_outcomes(path)) == []  # no store yet
    groups = [_group(1), msgspec.structs.replace(_group(2), split="train")]
    failed = msgspec.structs.replace(groups[1].trajectories[0], status="error:browser")
    groups[1] = msgspec.structs.replace(
        groups[1], trajectories=[failed, *groups[1].trajectories[1:]]
    )
    with TrajectoryStore(path) as store:
        for group in groups:
            store.append(group)
    with path.open("ab") as handle:
        handle.write(encode(_group(9))[:-10])
    outcomes = list(iter_outcomes(path))
    assert [(o.task_id, o.split) for o in outcomes] == [(1, ""), (2, "train")]
    assert [(t.reward, t.status) for t in outcomes[1].trajectories] == [
        (0.0, "error:browser"), (1.0, "exited"), (0.0, "exited"), (1.0, "exited")
    ]  # fmt: skip


def test_a_torn_last_line_is_reported_and_cut(tmp_path: Path) -> None:
    path = tmp_path / STORE_FILE
    with TrajectoryStore(path) as store:
        store.append(_group(0))
        store.append(_group(1))
    torn = encode(_group(2))[:-40]
    with path.open("ab") as handle:
        handle.write(torn)
    with capture_logs() as logs:
        assert [g.group_id for g in iter_groups(path)] == ["g0", "g1"]
    assert logs[0]["event"] == "store.torn_tail_skipped"
    with capture_logs() as logs, TrajectoryStore(path) as store:
        assert store.repaired_bytes == len(torn)
        store.append(_group(3))
    assert logs[0]["event"] == "store.torn_tail_cut"
    assert [g.group_id for g in iter_groups(path)] == ["g0", "g1", "g3"]


def test_a_corrupt_line_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / STORE_FILE
    path.write_bytes(encode(_group(0)) + b"\n" + b'{"group_id": 12}\n' + encode(_group(1)) + b"\n")
    with pytest.raises(StoreError, match=rf"{STORE_FILE}:2: not a trajectory group"):
        list(iter_groups(path))
    with pytest.raises(StoreError, match="cannot read"):
        list(iter_groups(tmp_path / "missing.jsonl"))


def test_a_writer_killed_mid_run_loses_no_acknowledged_group(tmp_path: Path) -> None:
    """SIGKILL a process that appends big groups as fast as it can; every group it
    acknowledged (printed after append returned) is read back whole, nothing else."""
    path = tmp_path / STORE_FILE
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_store import _group
        from runtime.store import TrajectoryStore
        store = TrajectoryStore({str(path)!r})
        for i in range(100000):
            store.append(_group(i, turns=40))
            print(i, flush=True)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acknowledged = -1
    for line in proc.stdout:
        acknowledged = int(line)
        if acknowledged >= 30:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    with proc.stdout:
        for line in proc.stdout.read().split():
            acknowledged = int(line)
    with TrajectoryStore(path) as store:
        repaired = store.repaired_bytes
    ids = [g.group_id for g in iter_groups(path)]
    assert ids[: acknowledged + 1] == [f"g{i}" for i in range(acknowledged + 1)]
    assert len(ids) <= acknowledged + 2  # at most the one being acknowledged when killed
    assert repaired >= 0
    assert path.read_bytes().endswith(b"\n")
