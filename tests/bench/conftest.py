"""The benchmarks are scripts in bench/ (run as `python bench/x.py`), not a package: their
folder goes on sys.path for these tests, as it does when they run."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
