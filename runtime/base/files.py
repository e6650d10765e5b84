"""Files and folders that appear whole or not at all: write beside, fsync, rename, fsync
the parent. The one copy of this in the project: the trajectory store's records, the
learner's adapters and checkpoints, the BC model, the locally made models and the sites'
storage states all go through these functions.

- `write_atomic(path, data)`: one file.
- `write_folder(target, fill)`: a folder; `fill(tmp)` writes its files into an empty
  temporary folder beside `target`, which is renamed into place once every file is synced.
  A crash leaves a `.NAME.tmp-*` folder beside it, never a half-written `target`.
- `fsync_dir`: for appenders that manage their own files (a JSONL store, a demo file
  renamed into place).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

__all__ = ["fsync_dir", "fsync_tree", "write_atomic", "write_folder"]


def fsync_dir(folder: str | Path) -> None:
    """fsync a folder, so that the names created or renamed in it are durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """fsync every file under `folder`, then every folder, deepest first."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
        fsync_dir(sub)
    fsync_dir(folder)


def write_atomic(path: str | Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace `path` with `data` atomically; the file gets permission bits `mode`
    (0o600 for secrets such as storage states). The folder must exist."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, mode)  # mkstemp makes 0600
    done = False
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        Path(tmp).replace(path)
        done = True
    finally:
        if not done:
            Path(tmp).unlink(missing_ok=True)
    fsync_dir(path.parent)


def write_folder(
    target: str | Path, fill: Callable[[Path], None], *, replace: bool = False
) -> Path:
    """Make `target` a folder holding what `fill(tmp)` writes into an empty temporary
    folder beside it; returns `target`. `fill` writes plainly: every file it leaves is
    fsynced here, before the rename.

    Every file is fsynced before the rename and the parent after it. An existing `target`
    is replaced when `replace` (removed just before the rename), else FileExistsError:
    a published name (an adapter version, a checkpoint) always means one set of files.
    Whatever `fill` raises propagates, and the temporary folder is removed.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and not replace:
        raise FileExistsError(f"{target} exists")
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        fill(tmp)
        fsync_tree(tmp)
        if target.exists():
            if not replace:
                raise FileExistsError(f"{target} exists")
            shutil.rmtree(target)
        tmp.rename(target)
        fsync_dir(target.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename
    return target
