"""The model profile: what the "auto" observation style, system prompt and BC prompt loss
become (`policy.profile.settle_auto`), and that nothing reads an "auto" left over."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from policy.profile import TINY_PROMPT_LOSS, settle_auto, unsettled
from policy.prompt import SHORT_SYSTEM_PROMPT, SYSTEM_PROMPT
from runtime.base.config import BCConfig, Config, ObservationConfig, PolicyConfig
from runtime.episode import EpisodeSettings
from runtime.observation import Snapshot, render


def _with_model(model: str, **policy: str) -> Config:
    return msgspec.structs.replace(Config(), policy=PolicyConfig(model=model, **policy))


def test_the_embedded_default_reads_compact_pages_and_the_short_prompt() -> None:
    resolved = settle_auto(Config())
    assert (resolved.observation.style, resolved.policy.system_prompt) == ("compact", "short")
    assert resolved.bc.prompt_loss == 0.0
    assert unsettled(Config()) == ["observation.style", "policy.system_prompt", "bc.prompt_loss"]
    assert unsettled(resolved) == []
    assert EpisodeSettings.from_config(resolved).system_prompt == SHORT_SYSTEM_PROMPT


def test_a_tiny_model_folder_carries_its_profile(tmp_path: Path) -> None:
    (tmp_path / "tiny_model.json").write_text(
        json.dumps(
            {"path": "x", "profile": {"observation_style": "html", "system_prompt": "short"}}
        )
    )
    resolved = settle_auto(_with_model(str(tmp_path)))
    assert (resolved.observation.style, resolved.policy.system_prompt) == ("html", "short")
    assert resolved.bc.prompt_loss == TINY_PROMPT_LOSS > 0  # a tiny model learns to read pages
    # a tiny model made before profiles were recorded: the tiny recipe's
    (tmp_path / "tiny_model.json").write_text(json.dumps({"path": "x"}))
    resolved = settle_auto(_with_model(str(tmp_path)))
    assert (resolved.observation.style, resolved.policy.system_prompt) == ("compact", "short")


def test_any_other_model_gets_webarena_html_and_the_full_prompt(tmp_path: Path) -> None:
    for model in (str(tmp_path), "Qwen/Qwen2.5-3B-Instruct"):
        resolved = settle_auto(_with_model(model))
        assert (resolved.observation.style, resolved.policy.system_prompt) == ("html", "full")
        assert resolved.bc.prompt_loss == 0.0
        assert EpisodeSettings.from_config(resolved).system_prompt == SYSTEM_PROMPT
    # the model named by the caller wins over policy.model (BC settles for its base)
    assert settle_auto(_with_model(str(tmp_path)), "").policy.system_prompt == "short"


def test_explicit_choices_are_kept() -> None:
    config = msgspec.structs.replace(
        _with_model("", system_prompt="full"),
        observation=ObservationConfig(style="html"),
        bc=BCConfig(prompt_loss=0.5),
    )
    resolved = settle_auto(config)
    assert (resolved.observation.style, resolved.policy.system_prompt) == ("html", "full")
    assert resolved.bc.prompt_loss == 0.5


def test_an_unresolved_auto_is_refused_where_it_would_be_read() -> None:
    from policy.prompt import system_prompt

    with pytest.raises(ValueError, match=r"observation\.style, policy\.system_prompt still 'auto'"):
        EpisodeSettings.from_config(Config())
    with pytest.raises(ValueError, match="settle_auto"):
        system_prompt("auto")
    with pytest.raises(ValueError, match="settle_auto"):
        snap = Snapshot(
            url="http://127.0.0.1:1/", title="T", scroll_y=0, viewport_height=10,
            page_height=10, root={"tag": "body", "children": []},
        )  # fmt: skip
        render(snap, ObservationConfig())
