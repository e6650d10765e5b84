"""TCMalloc in a child's environment (policy/allocator.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from policy import allocator
from policy.allocator import AllocatorError, find_tcmalloc, preload_env

MAPS = "print(any('tcmalloc' in line for line in open('/proc/self/maps')))"


def test_a_child_started_with_the_env_runs_on_tcmalloc() -> None:
    if find_tcmalloc() is None:
        pytest.fail(f"no TCMalloc here: `make setup` installs it ({allocator.TCMALLOC_INSTALL})")
    for setting, expected in (("tcmalloc", "True"), ("system", "False")):
        env = preload_env({"PATH": "/usr/bin:/bin"}, setting)
        out = subprocess.run(
            [sys.executable, "-c", MAPS], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == expected, (setting, env, out.stderr)


def test_it_goes_first_and_keeps_what_was_preloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: "/lib/libtcmalloc_minimal.so.4")
    env = preload_env({"LD_PRELOAD": "/opt/libgomp.so.1", "A": "1"}, "auto")
    assert env == {"LD_PRELOAD": "/lib/libtcmalloc_minimal.so.4:/opt/libgomp.so.1", "A": "1"}
    # a malloc the user preloaded is theirs
    chosen = {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}
    assert preload_env(chosen, "tcmalloc") == chosen
    assert preload_env({}, "system") == {}


def test_missing_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: None)
    assert preload_env({"X": "1"}, "auto") == {"X": "1"}  # glibc's malloc, as before
    with pytest.raises(AllocatorError, match="libtcmalloc-minimal4"):
        preload_env({}, "tcmalloc")
    with pytest.raises(ValueError, match="unknown allocator 'mimalloc'"):
        preload_env({}, "mimalloc")


def test_a_training_process_runs_itself_again_on_tcmalloc(monkeypatch: pytest.MonkeyPatch) -> None:
    """`run_self_on` (what `webagent train` calls) re-executes once, unless told not to.
    (The real daemon's process maps are checked in tests/runtime/test_daemon_stop.py.)"""
    calls: list[tuple[str, list[str], dict[str, str]]] = []

    class Executed(Exception):
        pass

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        calls.append((path, argv, env))
        raise Executed

    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: "/lib/libtcmalloc_minimal.so.4")
    monkeypatch.setattr(allocator.os, "execve", execve)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    with pytest.raises(Executed):
        allocator.run_self_on("auto", "runtime.cli", ["train", "--no-api"])
    executable, argv, env = calls.pop()
    assert executable == sys.executable
    assert argv == [sys.executable, "-m", "runtime.cli", "train", "--no-api"]
    assert env["LD_PRELOAD"] == "/lib/libtcmalloc_minimal.so.4"
    # already on it (the second start), or glibc's malloc asked for: it goes on as it is
    monkeypatch.setenv("LD_PRELOAD", "/lib/libtcmalloc_minimal.so.4")
    allocator.run_self_on("auto", "runtime.cli", ["train"])
    monkeypatch.delenv("LD_PRELOAD")
    allocator.run_self_on("system", "runtime.cli", ["train"])
    assert not calls


RELEASE = """
from policy.allocator import release_free_memory, resident_bytes
blocks = [bytearray(4 << 20) for _ in range(100)]  # 400 MiB, then freed
del blocks
before = resident_bytes()
print(release_free_memory(), before >> 20, resident_bytes() >> 20)
"""


def test_freed_memory_goes_back_to_the_system() -> None:
    """TCMalloc keeps what was freed (the daemon's bootstrap: 1.1 GiB of the conversion)
    until `release_free_memory` hands it back; on glibc's malloc it trims."""
    if find_tcmalloc() is None:
        pytest.fail(f"no TCMalloc here: `make setup` installs it ({allocator.TCMALLOC_INSTALL})")
    released: dict[str, tuple[str, int, int]] = {}
    for setting in ("tcmalloc", "system"):
        env = preload_env({"PATH": "/usr/bin:/bin", "PYTHONPATH": "."}, setting)
        out = subprocess.run(
            [sys.executable, "-c", RELEASE], env=env, capture_output=True, text=True, check=True
        )
        name, before, after = out.stdout.split()
        released[setting] = (name, int(before), int(after))
    name, mib_before, mib_after = released["tcmalloc"]
    assert name == "tcmalloc" and mib_before - mib_after > 300, released
    name, mib_before, mib_after = released["system"]
    assert name == "glibc" and mib_after <= mib_before + 16, released
