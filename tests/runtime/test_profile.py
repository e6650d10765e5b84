"""The model profile: which observation style and system prompt "auto" becomes."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from policy.prompt import SHORT_SYSTEM_PROMPT, SYSTEM_PROMPT
from runtime.base.config import Config, ObservationConfig, PolicyConfig
from runtime.episode import EpisodeSettings
from runtime.modelinit import resolve_profile
from runtime.observation import Snapshot, render


def _with_model(model: str, **policy: str) -> Config:
    return msgspec.structs.replace(Config(), policy=PolicyConfig(model=model, **policy))


def test_the_embedded_default_reads_compact_pages_and_the_short_prompt() -> None:
    resolved = resolve_profile(Config())
    assert (resolved.observation.style, resolved.policy.system_prompt) == ("compact", "short")
    assert EpisodeSettings.from_config(Config()).system_prompt == SHORT_SYSTEM_PROMPT


def test_a_tiny_model_folder_carries_its_profile(tmp_path: Path) -> None:
    (tmp_path / "tiny_model.json").write_text(
        json.dumps(
            {"path": "x", "profile": {"observation_style": "html", "system_prompt": "short"}}
        )
    )
    resolved = resolve_profile(_with_model(str(tmp_path)))
    assert (resolved.observation.style, resolved.policy.system_prompt) == ("html", "short")
    # a tiny model made before profiles were recorded: the tiny recipe's
    (tmp_path / "tiny_model.json").write_text(json.dumps({"path": "x"}))
    resolved = resolve_profile(_with_model(str(tmp_path)))
    assert (resolved.observation.style, resolved.policy.system_prompt) == ("compact", "short")


def test_any_other_model_gets_webarena_html_and_the_full_prompt(tmp_path: Path) -> None:
    for model in (str(tmp_path), "Qwen/Qwen2.5-3B-Instruct"):
        resolved = resolve_profile(_with_model(model))
        assert (resolved.observation.style, resolved.policy.system_prompt) == ("html", "full")
        assert EpisodeSettings.from_config(_with_model(model)).system_prompt == SYSTEM_PROMPT


def test_explicit_choices_are_kept() -> None:
    config = msgspec.structs.replace(
        _with_model("", system_prompt="full"), observation=ObservationConfig(style="html")
    )
    resolved = resolve_profile(config)
    assert (resolved.observation.style, resolved.policy.system_prompt) == ("html", "full")


def test_an_unresolved_auto_is_refused_where_it_would_be_read() -> None:
    from policy.prompt import system_prompt

    with pytest.raises(ValueError, match="resolve_profile"):
        system_prompt("auto")
    with pytest.raises(ValueError, match="resolve_profile"):
        snap = Snapshot(
            url="http://127.0.0.1:1/", title="T", scroll_y=0, viewport_height=10,
            page_height=10, root={"tag": "body", "children": []},
        )  # fmt: skip
        render(snap, ObservationConfig())
