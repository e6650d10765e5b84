"""runtime.guard's endpoint rules and `webagent config check` applying them."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from runtime.base.config import ConfigError, EndpointConfig
from runtime.cli import main
from runtime.guard import MIN_TOKEN_CHARS, endpoint_token, is_loopback

STRONG = "k" * MIN_TOKEN_CHARS


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1", True),
        ("0x7f000001", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("app.localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("example.org", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_no_token_is_allowed_on_loopback_only() -> None:
    assert endpoint_token(EndpointConfig(), {}) == ""
    assert endpoint_token(EndpointConfig(host="::1"), {}) == ""
    with pytest.raises(ConfigError, match=r"endpoint\.host: 0\.0\.0\.0 is not a loopback"):
        endpoint_token(EndpointConfig(host="0.0.0.0"), {})
    # A disabled endpoint serves nothing, so nothing is needed.
    assert endpoint_token(EndpointConfig(host="0.0.0.0", enabled=False), {}) == ""


def test_a_public_bind_needs_a_strong_token() -> None:
    with pytest.raises(ConfigError, match=r"endpoint\.token: the token is 9 characters"):
        endpoint_token(EndpointConfig(host="0.0.0.0", token="change-me"), {})
    assert endpoint_token(EndpointConfig(host="0.0.0.0", token=STRONG), {}) == STRONG
    # On loopback a short token is the user's business.
    assert endpoint_token(EndpointConfig(token="short"), {}) == "short"


def test_the_token_comes_from_a_file_or_an_environment_variable(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(STRONG + "\n")
    public = EndpointConfig(host="0.0.0.0", token_file=str(secret))
    assert endpoint_token(public, {}) == STRONG
    secret.write_text("short\n")
    with pytest.raises(ConfigError, match=r"endpoint\.token_file: the token is 5 characters"):
        endpoint_token(public, {})
    missing = msgspec.structs.replace(public, token_file=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=r"endpoint\.token_file: cannot read"):
        endpoint_token(missing, {})
    by_env = EndpointConfig(host="0.0.0.0", token_env="API_TOKEN")
    assert endpoint_token(by_env, {"API_TOKEN": STRONG}) == STRONG
    with pytest.raises(ConfigError, match="environment variable API_TOKEN is not set"):
        endpoint_token(by_env, {})
    both = EndpointConfig(token=STRONG, token_env="API_TOKEN")
    with pytest.raises(ConfigError, match="set only one of token, token_env"):
        endpoint_token(both, {"API_TOKEN": STRONG})


def _check(tmp_path: Path, endpoint: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(f"[endpoint]\n{endpoint}\n")
    return path


def test_config_check_refuses_an_open_public_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    open_public = _check(tmp_path, 'host = "0.0.0.0"')
    assert main(["config", "check", str(open_public)]) == 2
    err = capsys.readouterr().err
    assert f"{open_public}: endpoint.host: 0.0.0.0 is not a loopback address" in err
    weak = _check(tmp_path, 'host = "0.0.0.0"\ntoken = "change-me"')
    assert main(["config", "check", str(weak)]) == 2
    assert "at least 32" in capsys.readouterr().err
    by_env = _check(tmp_path, 'host = "0.0.0.0"\ntoken_env = "WEBAGENT_TEST_TOKEN"')
    monkeypatch.delenv("WEBAGENT_TEST_TOKEN", raising=False)
    assert main(["config", "check", str(by_env)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == f"ok: {by_env}"
    assert "$WEBAGENT_TEST_TOKEN is not readable here" in captured.err
    monkeypatch.setenv("WEBAGENT_TEST_TOKEN", "short")
    assert main(["config", "check", str(by_env)]) == 2
    assert "endpoint.token_env: the token is 5 characters" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["serve", "train"])
def test_the_daemon_refuses_to_start_an_open_public_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    config = _check(tmp_path, 'host = "0.0.0.0"')
    config.write_text(config.read_text() + f'[daemon]\nrun_dir = "{tmp_path / "run"}"\n')
    assert main([command, "--config", str(config)]) == 2
    assert "endpoint.host: 0.0.0.0 is not a loopback address" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before anything started
