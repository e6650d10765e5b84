"""bench/common.py: statistics, tables, PSS of a process tree, the JSON record."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import common


def test_median_and_percentile() -> None:
    assert common.median([3.0, 1.0, 2.0]) == 2.0
    assert common.median([1.0, 2.0, 3.0, 4.0]) == 2.5
    assert math.isnan(common.median([]))
    values = [float(v) for v in range(1, 101)]
    assert common.percentile(values, 0.95) == 95.0
    assert common.percentile(values, 0.5) == 50.0
    assert common.percentile(values, 1.0) == 100.0
    assert common.percentile([7.0], 0.95) == 7.0
    assert math.isnan(common.percentile([], 0.5))
    with pytest.raises(ValueError, match="q must lie"):
        common.percentile(values, 1.5)


def test_format_table_aligns_columns_and_formats_numbers() -> None:
    text = common.format_table(
        ["level", "eps/s", "name"], [[1, 12.345, "a"], [64, 0.01234, "long"]], title="T"
    )
    lines = text.splitlines()
    assert lines[0] == "T"
    assert len({len(line) for line in lines[1:]}) == 1  # every row as wide as the header
    assert "12.3" in lines[3] and "0.0123" in lines[4]
    assert lines[4].endswith("long") and lines[3].endswith("   a")
    assert common.format_table(["x"], [[float("nan")]]).splitlines()[-1].strip() == "n/a"


def test_pss_tree_counts_children() -> None:
    """A child holding 64 MiB of private memory raises the tree's PSS by about that much."""
    script = (
        "b = bytearray(64 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
        "print('ready', flush=True); input()"
    )
    before = common.pss_tree()
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        assert child.pid in common.descendants(os.getpid())
        own = common.pss_bytes(child.pid)
        assert own > 60 * 2**20
        assert common.pss_tree() - before > 60 * 2**20
    finally:
        child.kill()
        child.communicate()
    assert child.pid not in common.descendants(os.getpid())
    assert common.pss_bytes(child.pid) == 0


def test_load_sampler_records_peak_and_load() -> None:
    with common.LoadSampler(interval_s=0.01) as load:
        time.sleep(0.05)
    assert len(load.loads) >= 2
    assert load.peak_pss >= common.pss_bytes(os.getpid()) // 2
    note = common.load_note(load)
    assert f"on {os.cpu_count()} CPUs" in note and "during it" in note


def test_write_result_holds_machine_command_and_table(tmp_path: Path) -> None:
    with common.LoadSampler(interval_s=0.01) as load:
        pass
    path = common.write_result(
        tmp_path / "out",
        "demo",
        {"raw": [1, 2]},
        table={"title": "t", "headers": ["a"], "rows": [[1]]},
        notes=["n1"],
        load=load,
        argv=[str(Path(common.__file__).with_name("demo.py")), "--x", "a b"],
    )
    assert path.parent == tmp_path / "out" and path.name.startswith("demo-")
    record = json.loads(path.read_text())
    assert record["bench"] == "demo" and record["raw"] == [1, 2]
    assert record["command"] == ".venv/bin/python -m bench.demo --x 'a b'"
    assert common.command_line(["/elsewhere/x.py", "-q"]) == ".venv/bin/python /elsewhere/x.py -q"
    assert record["machine"]["cpus"] == os.cpu_count()
    assert record["machine"]["cpu_model"] == common.cpu_model()
    assert "load_during_mean" in record["machine"]
    assert record["table"]["rows"] == [[1]] and record["notes"] == ["n1"]
    assert not list(path.parent.glob("*.tmp"))
