"""Learner checkpoints and the group ledger: what makes a SIGKILL at any point harmless.

Layout of the learner's folder::

    adapters/policy@vN/        published adapters (learner.lora), one per version; the
                               newest `keep_adapters` are kept (at least max_staleness + 2)
    checkpoints/v000017/       the state after the update that made version 17
        lora.safetensors       trainable (LoRA) weights, exactly as in memory
        optimizer.pt           AdamW state
        scheduler.pt           lr schedule position
        rng.pt                 torch RNG states (CPU and CUDA: LoRA dropout)
        state.json             `LearnerState` (version, step, ledger, the algorithm that
                               wrote it), written LAST
    consumed.jsonl             journal: one line per group id taken from the stream

A checkpoint is written into `checkpoints/.v000017.tmp-*`, every file fsynced, `state.json`
last, then the folder is renamed into place and the parent fsynced; the newest complete
`v*` folder is the state. Temporary folders found at start-up are half-written: removed.

Group ledger. The journal gets a group's id (fsynced) as soon as the learner takes the
group from the stream, before it is used. The checkpoint holds which ids were trained (and
by which version), and which were set aside (stale, zero variance). At start-up, ids in
the journal but in none of those sets were consumed and not yet trained: they are re-read
from the trajectory store by id and trained first. Groups trained by an update whose
checkpoint never landed are not in the checkpoint either, so they are retrained by the
resumed learner exactly once (the update is repeated, under the same version number).

Order of one update: train -> save adapter vN+1 -> checkpoint vN+1 -> publish vN+1. A kill
before the checkpoint leaves an adapter folder newer than the checkpoint that was never
published: it is removed at start-up and made again. A kill after the checkpoint and
before publishing is repaired by publishing the checkpoint's version at start-up.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from learner.errors import CheckpointError
from runtime.base.files import write_folder

__all__ = [
    "ConsumedJournal",
    "LearnerState",
    "Ledger",
    "SavedCheckpoint",
    "latest_checkpoint",
    "prune_adapters",
    "remove_orphan_adapters",
    "write_checkpoint",
]

STATE_FILE = "state.json"
_CKPT = re.compile(r"^v(\d{6,})$")
_ADAPTER = re.compile(r"^(?P<prefix>.+)@v(?P<version>\d+)$")


class Ledger(msgspec.Struct, kw_only=True):
    """What became of every group id the learner consumed (all but the journal's tail)."""

    trained: dict[str, int] = {}  # group id -> the version its update produced
    stale: list[str] = []
    zero_variance: list[str] = []
    failed: list[str] = []  # fewer than two evaluated trajectories (infrastructure failures)

    def handled(self) -> set[str]:
        return set(self.trained) | set(self.stale) | set(self.zero_variance) | set(self.failed)


class LearnerState(msgspec.Struct, kw_only=True):
    """`state.json` of a checkpoint."""

    version: int
    step: int
    base_model: str
    base_fingerprint: str
    adapter_prefix: str = "policy"
    ledger: Ledger = msgspec.field(default_factory=Ledger)
    created_at: float = 0.0
    # The learner that wrote it (`learner.algorithm`): "mgrpo" or "webrl"; "" in the
    # checkpoints written before it was recorded.
    algorithm: str = ""


@dataclass(frozen=True, slots=True)
class SavedCheckpoint:
    """A complete checkpoint folder and its state."""

    path: Path
    state: LearnerState

    @property
    def lora_file(self) -> Path:
        return self.path / "lora.safetensors"

    @property
    def optimizer_file(self) -> Path:
        return self.path / "optimizer.pt"

    @property
    def scheduler_file(self) -> Path:
        return self.path / "scheduler.pt"

    @property
    def rng_file(self) -> Path:
        return self.path / "rng.pt"


def _name(version: int) -> str:
    return f"v{version:06d}"


def write_checkpoint(
    root: Path,
    state: LearnerState,
    write_files: Callable[[Path], None],
    *,
    keep: int = 2,
) -> SavedCheckpoint:
    """Write a checkpoint atomically: `write_files(tmp)` writes the tensors, then
    `state.json` goes last; the folder is renamed into place. Older checkpoints beyond the
    newest `keep` are removed afterwards."""
    final = root / _name(state.version)

    def fill(tmp: Path) -> None:
        write_files(tmp)
        (tmp / STATE_FILE).write_bytes(msgspec.json.encode(state))  # last: marks it complete

    try:
        # The same version again is refused rather than mixed (a retried update after a
        # crash before the rename is impossible: the rename is what makes it exist).
        write_folder(final, fill)
    except FileExistsError as exc:
        raise CheckpointError(f"{final} exists already") from exc
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {final}: {exc}") from exc
    for old in _complete(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return SavedCheckpoint(final, state)


def _complete(root: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if p.is_dir() and (m := _CKPT.match(p.name)) and (p / STATE_FILE).is_file()
    ]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: Path) -> SavedCheckpoint | None:
    """The newest complete checkpoint, after removing half-written temporary folders."""
    if not root.is_dir():
        return None
    for p in root.iterdir():
        if p.name.startswith(".") and ".tmp-" in p.name:
            shutil.rmtree(p, ignore_errors=True)
    complete = _complete(root)
    if not complete:
        return None
    path = complete[-1]
    try:
        state = msgspec.json.decode((path / STATE_FILE).read_bytes(), type=LearnerState)
    except (OSError, msgspec.DecodeError) as exc:
        raise CheckpointError(f"{path / STATE_FILE}: unreadable ({exc})") from exc
    return SavedCheckpoint(path, state)


def remove_orphan_adapters(adapters: Path, version: int | None, prefix: str) -> list[Path]:
    """Remove adapter folders newer than the checkpointed `version` (all when None) and
    half-written temporary ones: none of them was ever published. Returns what went."""
    if not adapters.is_dir():
        return []
    temporary = [p for p in adapters.iterdir()
                 if p.name.startswith(f".{prefix}@v") and ".tmp-" in p.name]  # fmt: skip
    newer = [p for v, p in _published(adapters, prefix) if version is None or v > version]
    removed = sorted(temporary + newer)
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def _published(adapters: Path, prefix: str) -> list[tuple[int, Path]]:
    """(version, folder) of every `prefix@vN` folder in `adapters`, oldest first."""
    if not adapters.is_dir():
        return []
    found = [(int(m["version"]), p) for p in adapters.iterdir()
             if (m := _ADAPTER.match(p.name)) and m["prefix"] == prefix]  # fmt: skip
    return sorted(found)


def prune_adapters(adapters: Path, newest: int, keep: int, prefix: str) -> list[Path]:
    """Remove the published adapter folders `prefix@vK` with K <= newest - keep, oldest
    first (`keep` 0: none). Returns what went."""
    if keep <= 0:
        return []
    removed = [p for v, p in _published(adapters, prefix) if v <= newest - keep]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


class ConsumedJournal:
    """Append-only, fsynced list of consumed group ids (`consumed.jsonl`).

    A torn last line (a kill in the middle of `append`) is ignored on reading: that
    group had not been used yet.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._cut_torn_tail()

    def _cut_torn_tail(self) -> None:
        """Drop bytes after the last newline, so the next append starts a clean line."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        keep = data.rfind(b"\n") + 1
        if keep < len(data):
            with self.path.open("r+b") as handle:
                handle.truncate(keep)
                os.fsync(handle.fileno())

    def append(self, group_id: str) -> None:
        line = msgspec.json.encode({"id": group_id}) + b"\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> list[str]:
        """Consumed ids in order, each once."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise CheckpointError(f"{self.path}: unreadable ({exc.strerror})") from exc
        ids: list[str] = []
        seen: set[str] = set()
        lines = data.split(b"\n")
        for number, line in enumerate(lines[:-1], start=1):  # the part after the last \n is torn
            if not line.strip():
                continue
            try:
                gid = msgspec.json.decode(line, type=dict[str, str])["id"]
            except (msgspec.DecodeError, KeyError) as exc:
                raise CheckpointError(f"{self.path}:{number}: not a journal line") from exc
            if gid not in seen:
                seen.add(gid)
                ids.append(gid)
        return ids
