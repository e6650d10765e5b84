"""Checkpoint folders, the consumed-groups journal, orphan adapters, the lr schedule."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from learner.checkpoint import (
    ConsumedJournal,
    LearnerState,
    Ledger,
    latest_checkpoint,
    prune_adapters,
    remove_orphan_adapters,
    write_checkpoint,
)
from learner.engine import lr_factor
from learner.errors import CheckpointError


def state(version: int, trained: dict[str, int] | None = None) -> LearnerState:
    return LearnerState(
        version=version,
        step=2 * version,
        base_model="m",
        base_fingerprint="f",
        ledger=Ledger(trained=trained or {}, stale=["s"], zero_variance=["z"]),
    )


def test_checkpoints_appear_whole_and_old_ones_go(tmp_path: Path) -> None:
    def files(folder: Path) -> None:
        (folder / "optimizer.pt").write_bytes(b"x")

    for v in range(4):
        write_checkpoint(tmp_path, state(v, {f"g{v}": v}), files, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000002", "v000003"]
    saved = latest_checkpoint(tmp_path)
    assert saved is not None and saved.state == state(3, {"g3": 3})
    assert saved.state.ledger.handled() == {"g3", "s", "z"}

    # a crash while writing: files but no state.json, in a temporary folder -> ignored, removed
    half = tmp_path / ".v000004.tmp-1-abc"
    half.mkdir()
    (half / "optimizer.pt").write_bytes(b"x")
    saved = latest_checkpoint(tmp_path)
    assert saved is not None and saved.state.version == 3
    assert not half.exists()

    def dies(folder: Path) -> None:
        raise OSError("disk full")

    with pytest.raises(CheckpointError, match="disk full"):
        write_checkpoint(tmp_path, state(5), dies)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000002", "v000003"]
    with pytest.raises(CheckpointError, match="exists"):
        write_checkpoint(tmp_path, state(3), files)
    (tmp_path / "v000003" / "state.json").write_text("{")
    with pytest.raises(CheckpointError, match="unreadable"):
        latest_checkpoint(tmp_path)
    assert latest_checkpoint(tmp_path / "none") is None


def test_journal_survives_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "consumed.jsonl"
    journal = ConsumedJournal(path)
    for gid in ("a", "b", "a"):
        journal.append(gid)
    assert journal.read() == ["a", "b"]
    with path.open("ab") as f:
        f.write(b'{"id": "c')  # killed in the middle of an append
    assert ConsumedJournal(path).read() == ["a", "b"]  # reopening cuts the torn tail
    reopened = ConsumedJournal(path)
    reopened.append("d")
    assert reopened.read() == ["a", "b", "d"]
    path.write_bytes(b'{"id": "a"}\nnot json\n')
    with pytest.raises(CheckpointError, match=r"consumed\.jsonl:2"):
        ConsumedJournal(path).read()


def test_orphan_adapters_are_those_never_published(tmp_path: Path) -> None:
    for name in ("policy@v0", "policy@v1", "policy@v2", ".policy@v3.tmp-9-x", "other@v5"):
        (tmp_path / name).mkdir()
    removed = remove_orphan_adapters(tmp_path, 1, "policy")
    assert sorted(p.name for p in removed) == [".policy@v3.tmp-9-x", "policy@v2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other@v5", "policy@v0", "policy@v1"]
    assert [p.name for p in remove_orphan_adapters(tmp_path, None, "policy")] == [
        "policy@v0",
        "policy@v1",
    ]


def test_prune_keeps_the_newest_published_adapters(tmp_path: Path) -> None:
    for name in ("policy@v0", "policy@v1", "policy@v2", "policy@v10", "other@v0"):
        (tmp_path / name).mkdir()
    assert prune_adapters(tmp_path, 10, 0, "policy") == []  # keep 0: all stay
    removed = prune_adapters(tmp_path, 10, 9, "policy")  # v2..v10 may stay
    assert [p.name for p in removed] == ["policy@v0", "policy@v1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other@v0", "policy@v10", "policy@v2"]


def test_lr_schedule() -> None:
    assert [lr_factor(s, warmup=4, schedule="constant", total=0) for s in range(6)] == [
        0.25,
        0.5,
        0.75,
        1.0,
        1.0,
        1.0,
    ]
    cosine = [lr_factor(s, warmup=2, schedule="cosine", total=12) for s in range(14)]
    assert cosine[:3] == [0.5, 1.0, 1.0]
    assert cosine[7] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert cosine[12] == pytest.approx(0.0, abs=1e-12) and cosine[13] == pytest.approx(0.0)
    assert all(a >= b for a, b in itertools.pairwise(cosine[1:]))
