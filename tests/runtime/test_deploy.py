"""Every configuration shipped under deploy/ is valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.base.config import Config, load_config
from runtime.cli import main

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CONFIGS = sorted(DEPLOY.glob("*.toml"))


def test_deploy_has_configs() -> None:
    assert {p.name for p in CONFIGS} >= {"gpu-host.toml", "cpu-demo.toml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_check_passes(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"ok: {path}"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_no_shipped_config_holds_a_token(path: Path) -> None:
    """A placeholder like `token = "change-me"` ends up deployed; tokens come from
    `token_env` or `token_file`."""
    endpoint = load_config(path).endpoint
    assert endpoint.token == "", path


def test_the_gpu_host_reads_its_token_from_the_environment() -> None:
    endpoint = load_config(DEPLOY / "gpu-host.toml").endpoint
    assert endpoint.host == "0.0.0.0" and endpoint.token_env == "WEBAGENT_TOKEN"
    compose = (DEPLOY / "compose.gpu.yaml").read_text()
    assert "WEBAGENT_TOKEN: ${WEBAGENT_TOKEN:?" in compose


def test_the_cpu_demo_is_the_embedded_default_written_out() -> None:
    """cpu-demo.toml says `webagent train` with no config uses its values: it does."""
    demo = load_config(DEPLOY / "cpu-demo.toml")
    default = Config()
    assert demo.daemon.run_dir != default.daemon.run_dir  # its own run directory
    for section in ("sites", "browser", "policy", "scheduler", "learner", "endpoint"):
        assert getattr(demo, section) == getattr(default, section), section
    assert demo.daemon.data_dir == default.daemon.data_dir
