"""Every configuration shipped under deploy/ is valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.cli import main

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CONFIGS = sorted(DEPLOY.glob("*.toml"))


def test_deploy_has_configs() -> None:
    assert {p.name for p in CONFIGS} >= {"gpu-host.toml", "cpu-demo.toml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_check_passes(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"ok: {path}"
