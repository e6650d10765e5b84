"""Chromium through Playwright: which binary, with which flags.

Debian's `chromium-headless-shell` is preferred for episodes: on two cores it ran ~3x the
actions/s of full Chromium at a third of the memory per context (MACHINE_NOTES.md).
The real binaries are launched, not the wrapper scripts on the PATH.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CHROMIUM_ARGS", "find_chromium"]

# Flags that keep Chromium from calling out (this machine has no network, and a closed
# network makes every background request fail) and from using the GPU.
CHROMIUM_ARGS: tuple[str, ...] = (
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-default-apps",
    "--mute-audio",
)

_CANDIDATES: tuple[str, ...] = (
    "/usr/lib/chromium/chromium-headless-shell",
    "/usr/lib/chromium/chromium",
)


def find_chromium(configured: str = "") -> str | None:
    """The Chromium binary to launch: the configured one, else Debian's, else None.

    None means "let Playwright use its own download", which exists only where
    `playwright install` could run.
    """
    if configured:
        if not Path(configured).is_file():
            raise FileNotFoundError(f"browser.executable_path: no such file: {configured}")
        return configured
    for candidate in _CANDIDATES:
        if Path(candidate).is_file():
            return candidate
    return None
