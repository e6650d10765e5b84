"""bench/results.py: newest record per benchmark, the markdown, the results page's markers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import results


def _record(folder: Path, name: str, rows: list[list[object]], **extra: object) -> Path:
    path = folder / name
    record = {
        "bench": name.split("-", maxsplit=1)[0],
        "command": f".venv/bin/python -m bench.{name.split('-', maxsplit=1)[0]} --fast",
        "machine": {"cpus": 2, "cpu_model": "AMD EPYC", "load_during_mean": 3.5},
        "table": {"title": "T", "headers": ["level", "x|y"], "rows": rows},
        "notes": ["ratio 2.0"],
        **extra,
    }
    path.write_text(json.dumps(record))
    return path


def test_newest_picks_the_latest_stamp_per_bench(tmp_path: Path) -> None:
    _record(tmp_path, "rollout-20260101-120000.json", [[1, 1.0]])
    _record(tmp_path, "rollout-20260102-090000.json", [[1, 2.0]])
    _record(tmp_path, "learner-20251231-235959.json", [[1, 3.0]])
    (tmp_path / "rollout-notes.json").write_text("{}")
    (tmp_path / "hotswap-vllm.log").write_text("")
    files = results.newest(tmp_path)
    assert files == {
        "rollout": tmp_path / "rollout-20260102-090000.json",
        "learner": tmp_path / "learner-20251231-235959.json",
    }


def test_render_orders_sections_and_escapes_cells(tmp_path: Path) -> None:
    _record(tmp_path, "pipeline-20260101-120000.json", [["async", 12.3456]])
    _record(tmp_path, "rollout-20260101-120000.json", [[64, 0.5]])
    _record(tmp_path, "zzz-20260101-120000.json", [["a|b", float("nan")]])
    text = results.render(tmp_path)
    assert text.index("### rollout") < text.index("### pipeline") < text.index("### zzz")
    assert "| level | x\\|y |" in text
    assert "| async | 12.3 |" in text and "| a\\|b | n/a |" in text
    assert "- reproduce: `.venv/bin/python -m bench.rollout --fast`" in text
    assert "2 CPUs (AMD EPYC)" in text and "mean 3.5" in text
    assert "- ratio 2.0" in text


def test_older_hotswap_record_gets_a_table(tmp_path: Path) -> None:
    phase = {
        "seconds": 10.0,
        "requests": 100,
        "requests_per_s": 10.0,
        "tokens_per_s": 160.0,
        "failed": 0,
        "mixed_version": 0,
        "versions_served": 1,
    }
    (tmp_path / "hotswap-20260101-120000.json").write_text(
        json.dumps(
            {
                "concurrency": 16,
                "swaps": 10,
                "phases": {"before": phase, "during": phase},
                "publish_s": {"median": 0.05, "p95": 0.1},
                "first_response_s": {"median": 0.2, "p95": 0.3},
            }
        )
    )
    text = results.render(tmp_path)
    assert "| during | 10.0 | 100 | 10.0 | 160 | 0 | 0 | 1 |" in text
    assert "publish (call -> routed) median 50 ms" in text
    assert "reproduce: `.venv/bin/python -m bench.hotswap`" in text


def test_replace_section_touches_only_the_markers(tmp_path: Path) -> None:
    readme = "# x\n\n## Results\n\n<!-- results:start -->\nold\n<!-- results:end -->\n\n## After\n"
    out = results.replace_section(readme, "\nnew table\n")
    assert out == (
        "# x\n\n## Results\n\n<!-- results:start -->\nnew table\n<!-- results:end -->\n\n## After\n"
    )
    assert results.replace_section(out, "new table") == out  # idempotent
    with pytest.raises(ValueError, match="markers"):
        results.replace_section("# no markers\n", "x")


def test_main_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    _record(out, "learner-20260101-120000.json", [["update", 1.5]])
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:start -->\n<!-- results:end -->\ntail\n")
    assert results.main(["--out", str(out), "--page", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n<!-- results:start -->\n") and text.endswith("tail\n")
    assert "### learner" in text and "| update | 1.50 |" in text
    (tmp_path / "bad.md").write_text("no markers")
    assert results.main(["--out", str(out), "--page", str(tmp_path / "bad.md")]) == 2


def test_main_keeps_the_sections_it_has_no_json_for(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    readme = tmp_path / "README.md"
    readme.write_text(
        "intro\n<!-- results:start -->\nheader\n\n### rollout\n\nrollout from elsewhere\n\n"
        "### learner\n\nold learner table\n<!-- results:end -->\ntail\n"
    )
    _record(out, "learner-20260101-120000.json", [["update", 1.5]])
    _record(out, "pipeline-20260101-120000.json", [["async", 2.0]])
    assert results.main(["--out", str(out), "--page", str(readme)]) == 0
    text = readme.read_text()
    assert "rollout from elsewhere" in text and "old learner table" not in text
    assert "| update | 1.50 |" in text and "| async | 2.00 |" in text
    assert text.index("### rollout") < text.index("### learner") < text.index("### pipeline")
    assert text.endswith("<!-- results:end -->\ntail\n")
    assert results.main(["--out", str(out), "--page", str(readme)]) == 0
    assert readme.read_text() == text  # idempotent
