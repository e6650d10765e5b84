"""The benchmarks are the `bench` package at the repository root (run as
`python -m bench.NAME`), which is not installed: the root goes on sys.path for these tests."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
