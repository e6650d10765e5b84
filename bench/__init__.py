"""Benchmarks: run each as `.venv/bin/python -m bench.NAME` from the repository root."""
