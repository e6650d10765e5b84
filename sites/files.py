"""Writing a file so that it is whole or absent: temp file, fsync, rename, fsync the folder.

Here in `sites` (which imports nothing of the project but `runtime.config` and
`runtime.messages`) so that both `sites` and `runtime` can use it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_atomic"]


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
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
