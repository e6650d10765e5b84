"""`webagent rollout`, `demos` and `trajectories show`, run in-process."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import structlog

from runtime.cli import main as cli_main
from runtime.store import iter_groups

pytestmark = [pytest.mark.browser]


def main(argv: list[str]) -> int:
    """The CLI in a thread of its own: the anyio test plugin may run a loop in this one.
    The CLI configures logging for the process; later tests get the defaults back."""
    try:
        with ThreadPoolExecutor(1) as executor:
            return executor.submit(cli_main, argv).result()
    finally:
        structlog.reset_defaults()


def test_rollout_then_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "run" / "trajectories.jsonl"
    code = main(
        ["--log-level", "warning", "rollout", "--split", "test", "--tasks", "2",
         "--group-size", "2", "--concurrency", "4", "--out", str(store)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "oracle on test: 2 groups, 4 episodes" in out
    assert "all                      4         4  100.0%" in out
    assert "episodes/s" in out and "steps/s" in out
    assert "without (ratio 0." in out
    assert len(list(iter_groups(store))) == 2

    assert main(["trajectories", "show", str(tmp_path / "run")]) == 0
    shown = capsys.readouterr().out
    assert shown.count("episode ") >= 4
    assert "action: exit(message=" in shown
    assert "2 groups, 4 episodes, 4 succeeded" in shown


def test_demos_write_a_complete_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demos.jsonl"
    code = main(
        ["--log-level", "warning", "demos", "--split", "train", "--tasks", "3", "--out", str(out)]
    )
    assert code == 0
    assert "wrote 3 demonstrations" in capsys.readouterr().out
    groups = list(iter_groups(out))
    assert len(groups) == 3
    assert all(t.reward == 1.0 and t.turns for g in groups for t in g.trajectories)
    assert not (tmp_path / "demos.jsonl.partial").exists()


def test_bad_requests_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trajectories", "show", str(tmp_path / "nothing")]) == 2
    assert "no trajectory store there" in capsys.readouterr().err
    assert main(["rollout", "--group-size", "0"]) == 2
    assert "--group-size must be at least 1" in capsys.readouterr().err
    assert main(["rollout", "--split", "nope", "--tasks", "1"]) == 2
    assert "no split 'nope' in the built-in suite" in capsys.readouterr().err


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`webagent config show | head -1`: no BrokenPipeError traceback, SIGPIPE's code."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "config", "show"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # gone before the command writes
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 141, err
    assert "Traceback" not in err
