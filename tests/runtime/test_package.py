"""Package-level promises: exports, import cost, logging, the CLI's surface."""

from __future__ import annotations

import importlib
import io
import json
import pkgutil
import subprocess
import sys

import pytest
import structlog
from structlog.testing import capture_logs

from runtime import __version__
from runtime.cli import main
from runtime.logs import bind_ids, configure_logging

PACKAGES = ("runtime", "policy", "learner", "sites")


@pytest.mark.parametrize("name", PACKAGES)
def test_exports_are_sorted_and_exist(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.{attr} is exported but missing"


def test_runtime_does_not_import_torch() -> None:
    """The endpoint-only deployment runs without torch: no runtime module may import it."""
    modules = [
        m.name
        for m in pkgutil.walk_packages(importlib.import_module("runtime").__path__, "runtime.")
        if not m.name.endswith("__main__")
    ]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in ('torch', 'transformers', 'peft', 'vllm') if m in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert len(modules) >= 3
    assert out.stdout.strip() == ""


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"webagent-r1 {__version__}"
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "config" in capsys.readouterr().out


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: webagent" in capsys.readouterr().out


def test_logs_carry_bound_ids() -> None:
    merge = structlog.contextvars.merge_contextvars
    with capture_logs(processors=[merge]) as logs, bind_ids(episode_id="e1", group_id="g1"):
        structlog.get_logger().info("episode.finished", reward=1.0)
    assert logs == [
        {
            "event": "episode.finished",
            "reward": 1.0,
            "log_level": "info",
            "episode_id": "e1",
            "group_id": "g1",
        }
    ]


def test_json_lines_off_a_terminal() -> None:
    out = io.StringIO()  # not a tty
    configure_logging(stream=out)
    try:
        with bind_ids(adapter="policy@v1"):
            structlog.get_logger().info("swap", latency_s=0.02)
    finally:
        structlog.reset_defaults()
    line = json.loads(out.getvalue())
    assert line["event"] == "swap"
    assert line["adapter"] == "policy@v1"
    assert line["level"] == "info"
    assert "timestamp" in line
