"""`webagent tasks check` on a good and a broken WebArena-format file."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from runtime.cli import main

FIXTURE = Path(__file__).parent / "fixtures" / "webarena_tasks.json"


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    """`main` points structlog at this test's captured stderr; undo that afterwards."""
    yield
    structlog.reset_defaults()


def test_check_good_file_prints_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", "check", str(FIXTURE)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"ok: {FIXTURE}: 13 tasks"
    rows = {tuple(line.split()) for line in lines if line.startswith("  ")}
    for row in [
        ("gitlab", "3"),
        ("map+wikipedia", "1"),
        ("shopping", "3"),
        ("string_match", "6"),
        ("url_match", "5"),
        ("program_html", "4"),
        ("program_html.fuzzy_match", "1"),
    ]:
        assert row in rows, (row, out)
    assert "not fully evaluable here: 1 tasks" in out
    assert "task 9: program_html[0]: unsupported: helper shopping_get_latest_order_url()" in out


def test_check_broken_file_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = json.loads(FIXTURE.read_text())
    raw[6]["eval"]["program_html"][1]["required_contents"] = {"must_include": "x", "contains": []}
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(raw))
    assert main(["tasks", "check", str(broken)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"webagent: error: {broken}: task 6: eval.program_html[1].required_contents.contains: "
        "unknown rule (known: exact_match, must_include, must_exclude, one_of, "
        "required_values, fuzzy_match)\n"
    )


def test_check_with_site_urls(capsys: pytest.CaptureFixture[str]) -> None:
    names = ("SHOPPING", "SHOPPING_ADMIN", "REDDIT", "GITLAB", "MAP", "WIKIPEDIA")
    args = [arg for name in names for arg in ("--url", f"{name}=http://h.test")]
    assert main(["tasks", "check", str(FIXTURE), *args]) == 0
    assert capsys.readouterr().out.startswith("ok:")
    assert main(["tasks", "check", str(FIXTURE), "--url", "SHOPPING=http://h.test"]) == 2
    err = capsys.readouterr().err
    assert "task 0: start_url: no URL for placeholder __SHOPPING_ADMIN__" in err
    assert main(["tasks", "check", str(FIXTURE), "--url", "SHOPPING"]) == 2
    assert "--url expects NAME=URL, got 'SHOPPING'" in capsys.readouterr().err


def test_console_script_exit_codes(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    run = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "tasks", "check", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2
    assert (
        run.stderr.strip() == f"webagent: error: {missing}: cannot read (No such file or directory)"
    )


@pytest.mark.parametrize("opening", ["[", '{"a":'])
def test_check_deeply_nested_json_exits_2_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], opening: str
) -> None:
    closing = "]" if opening == "[" else "}"
    deep = tmp_path / "deep.json"
    deep.write_text(opening * 100_000 + closing * 100_000)
    assert main(["tasks", "check", str(deep)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"webagent: error: {deep}: JSON nested too deeply to be a task file\n"
