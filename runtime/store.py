"""The trajectory store: append-only JSON lines of `TrajectoryGroup`s, crash-safe.

One line per group (`runtime.base.messages.encode`, then a newline), written with a single
append and fsynced before `append()` returns: a group is stored whole or not at all.
A crash in the middle of a write leaves a last line without its newline; opening the
store for writing detects it, reports it (log line `store.torn_tail_cut` and
`TrajectoryStore.repaired_bytes`) and cuts it off; readers skip it. It is never read as
data. Any other line that does not decode is a `StoreError` naming file and line.

A run directory keeps its store at `RUN_DIR/trajectories.jsonl` (`store_path`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

import anyio
import msgspec
import structlog

from runtime.base.files import fsync_dir
from runtime.base.messages import TrajectoryGroup, decode_group, encode
from runtime.errors import StoreError

__all__ = [
    "STORE_FILE",
    "JsonLines",
    "TrajectoryStore",
    "iter_group_ids",
    "iter_groups",
    "iter_outcomes",
    "json_lines",
    "read_group",
    "read_groups",
    "store_path",
    "unseen_groups",
]

STORE_FILE = "trajectories.jsonl"

log = structlog.get_logger("runtime.store")

_CHUNK = 1 << 16


def store_path(run_or_file: str | Path) -> Path:
    """The store file of a run directory, or the file itself."""
    path = Path(run_or_file)
    return path / STORE_FILE if path.is_dir() else path


def _torn_tail(fd: int, size: int) -> int:
    """Bytes after the last newline of the file (0 when it ends with one or is empty)."""
    if size == 0:
        return 0
    end = size
    while end > 0:
        start = max(0, end - _CHUNK)
        chunk = os.pread(fd, end - start, start)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            return size - (start + cut + 1)
        end = start
    return size


class JsonLines:
    """An append-only file of JSON lines, open for appending: each `append_line` is one
    write and an fsync; a torn last line (a crash mid-write) is cut when it is opened.
    `TrajectoryStore` is one for groups; WebRL's generated tasks are another
    (`runtime.evolution`)."""

    what = "file"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            created = not self.path.exists()
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open the {self.what} ({exc.strerror})") from exc
        try:
            if created:
                fsync_dir(self.path.parent)
            size = os.fstat(self._fd).st_size
            self.repaired_bytes = _torn_tail(self._fd, size)
            if self.repaired_bytes:
                os.ftruncate(self._fd, size - self.repaired_bytes)
                os.fsync(self._fd)
                log.warning(
                    "store.torn_tail_cut",
                    path=str(self.path),
                    bytes=self.repaired_bytes,
                    reason="the last line was being written when a crash happened",
                )
        except OSError as exc:
            os.close(self._fd)
            raise StoreError(
                f"{self.path}: cannot check the {self.what}'s last line ({exc})"
            ) from exc

    def append_line(self, data: bytes) -> None:
        """Write `data` and a newline at once and fsync; durable when this returns."""
        with self._lock:
            if self._fd < 0:
                raise StoreError(f"{self.path}: the {self.what} is closed")
            try:
                view = memoryview(data + b"\n")
                while view:
                    written = os.write(self._fd, view)
                    view = view[written:]
                os.fsync(self._fd)
            except OSError as exc:
                raise StoreError(f"{self.path}: cannot append a line ({exc.strerror})") from exc

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class TrajectoryStore(JsonLines):
    """An open store, for appending. `with TrajectoryStore(path) as store: store.append(g)`."""

    what = "trajectory store"

    def append(self, group: TrajectoryGroup) -> None:
        """Write `group` as one line and fsync; when this returns the group is durable."""
        self.append_line(encode(group))

    async def append_async(self, group: TrajectoryGroup) -> None:
        """`append` in a worker thread, so the event loop does not wait for fsync."""
        await anyio.to_thread.run_sync(self.append, group)


def iter_groups(run_or_file: str | Path) -> Iterator[TrajectoryGroup]:
    """Every group of a store, oldest first; a torn last line is skipped and reported."""
    path = store_path(run_or_file)
    for number, line in json_lines(path, warn_torn=True):
        try:
            yield decode_group(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StoreError(f"{path}:{number}: not a trajectory group ({exc})") from exc


def json_lines(path: Path, *, warn_torn: bool = False) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of every complete, non-blank line of the file at `path` (a
    store, or another `JsonLines` file); a torn last line (no newline) ends it."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise StoreError(f"{path}: cannot read {path.name} ({exc.strerror})") from exc
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n"):
                if warn_torn:
                    log.warning(
                        "store.torn_tail_skipped", path=str(path), line=number, bytes=len(line)
                    )
                return
            if line.strip():
                yield number, line


class _GroupId(msgspec.Struct):
    group_id: str


_id_decoder = msgspec.json.Decoder(_GroupId)


class EpisodeOutcome(msgspec.Struct, frozen=True):
    reward: float = 0.0
    status: str = "exited"


class GroupOutcome(msgspec.Struct, frozen=True):
    """What a stored group's episodes scored, without their turns."""

    task_id: int
    trajectories: list[EpisodeOutcome]
    split: str = ""
    guide: int = 0


_outcome_decoder = msgspec.json.Decoder(GroupOutcome)


def iter_outcomes(run_or_file: str | Path) -> Iterator[GroupOutcome]:
    """Task, rewards and statuses of every stored group, oldest first (a torn last line
    is skipped; none when the store does not exist yet); the turns are not decoded."""
    path = store_path(run_or_file)
    if not path.exists():
        return
    for number, line in json_lines(path):
        try:
            yield _outcome_decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StoreError(f"{path}:{number}: not a trajectory group ({exc})") from exc


def iter_group_ids(run_or_file: str | Path) -> Iterator[str]:
    """The group id of every stored line, oldest first (a torn last line is skipped);
    only the id is decoded, so this is cheap on a long run's store."""
    path = store_path(run_or_file)
    for number, line in json_lines(path):
        try:
            yield _id_decoder.decode(line).group_id
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StoreError(f"{path}:{number}: not a trajectory group ({exc})") from exc


def read_groups(run_or_file: str | Path, group_ids: Iterable[str]) -> list[TrajectoryGroup]:
    """The stored groups with these ids, in store order (decoding only their lines)."""
    wanted = set(group_ids)
    path = store_path(run_or_file)
    found: list[TrajectoryGroup] = []
    for number, line in json_lines(path):
        try:
            if _id_decoder.decode(line).group_id not in wanted:
                continue
            found.append(decode_group(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StoreError(f"{path}:{number}: not a trajectory group ({exc})") from exc
    return found


def unseen_groups(run_or_file: str | Path, seen: Callable[[str], bool]) -> list[TrajectoryGroup]:
    """The stored groups for which `seen(group_id)` is False, oldest first (none when the
    store does not exist yet)."""
    path = store_path(run_or_file)
    if not path.exists():
        return []
    wanted = [gid for gid in iter_group_ids(path) if not seen(gid)]
    return read_groups(path, wanted) if wanted else []


def read_group(run_or_file: str | Path, group_id: str) -> TrajectoryGroup:
    """The group with `group_id`; raises KeyError naming it when the store has none."""
    needle = f'"group_id":"{group_id}"'.encode()
    for group in _candidates(store_path(run_or_file), needle):
        if group.group_id == group_id:
            return group
    raise KeyError(f"no group {group_id!r} in {store_path(run_or_file)}")


def _candidates(path: Path, needle: bytes) -> Iterator[TrajectoryGroup]:
    """Groups whose line mentions `needle` (decoding only those)."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the trajectory store ({exc.strerror})") from exc
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n") or needle not in line:
                continue
            try:
                yield decode_group(line)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise StoreError(f"{path}:{number}: not a trajectory group ({exc})") from exc
