"""LoRA adapters: attach to a base model, save atomically with a manifest, verify.

An adapter folder is what vLLM loads (peft's `save_pretrained` layout:
`adapter_config.json` + `adapter_model.safetensors`) plus `manifest.json`
(`runtime.base.messages.AdapterManifest`). Saving:

1. peft's files (`save_pretrained`) go into a temporary folder beside the final one
   (same parent, so the rename is atomic on one file system);
2. hash `adapter_model.safetensors` (sha256) and write `manifest.json` last;
3. fsync every file and the folder, rename it to `<parent>/<prefix>@v<N>`, fsync the
   parent (`runtime.base.files.write_folder`).

A folder without a manifest, or whose weights do not hash to the manifest's, is
half-written or corrupted: `verify_adapter` refuses it, and it is never published.

The base fingerprint (`base_fingerprint`) identifies the base model's files cheaply:
sha256 over the sorted names and sizes of its config, tokenizer and weight files and their
contents, where a weight file above 64 MiB contributes only its first and last MiB and 16
evenly spaced 64 KiB samples (so a 15 GB model is fingerprinted in milliseconds, and any
re-training that touches every tensor still changes it).

A freshly attached LoRA is zero in effect: peft's default init draws A at random and sets
B to zero, so B @ A = 0 and the adapted model's outputs equal the base model's exactly.
`zero_adapter` writes v0 for serving before any training: every weight zero.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from learner.errors import AdapterError
from policy import adapters as _policy
from policy.errors import AdapterManifestError
from runtime.base.config import LearnerConfig
from runtime.base.files import write_folder
from runtime.base.messages import AdapterManifest

__all__ = [
    "ADAPTER_WEIGHTS",
    "MANIFEST",
    "adapter_name",
    "attach_lora",
    "base_fingerprint",
    "save_adapter",
    "verify_adapter",
    "zero_adapter",
]

# The file names and the manifest check are the policy layer's (`policy.adapters`): the
# side that serves an adapter decides what a complete one is; this side writes them.
MANIFEST = _policy.MANIFEST_FILE
ADAPTER_WEIGHTS = _policy.WEIGHTS_FILE
ADAPTER_CONFIG = "adapter_config.json"

_BIG_FILE = 64 << 20
_EDGE = 1 << 20
_SAMPLE = 64 << 10
_SAMPLES = 16
_FINGERPRINT_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)
_WEIGHT_SUFFIXES = (".safetensors", ".bin")


def adapter_name(version: int, prefix: str = "policy") -> str:
    """`policy@v17`: the served name and the folder name of a version."""
    return _policy.adapter_name(prefix, version)


def base_fingerprint(model_dir: str | Path) -> str:
    """Cheap identity of a model folder's config, tokenizer and weights (see module doc)."""
    folder = Path(model_dir)
    if not folder.is_dir():
        raise AdapterError(f"{folder}: base model folder not found")
    names = sorted(
        p.name
        for p in folder.iterdir()
        if p.is_file() and (p.name in _FINGERPRINT_FILES or p.name.endswith(_WEIGHT_SUFFIXES))
    )
    if not any(n.endswith(_WEIGHT_SUFFIXES) for n in names):
        raise AdapterError(f"{folder}: no weight files (*.safetensors, *.bin) to fingerprint")
    digest = hashlib.sha256()
    for name in names:
        path = folder / name
        size = path.stat().st_size
        digest.update(f"{name}\0{size}\0".encode())
        with path.open("rb") as handle:
            if size <= _BIG_FILE:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
                continue
            step = (size - _SAMPLE) // (_SAMPLES + 1)
            reads = [(0, _EDGE), (size - _EDGE, _EDGE)]
            reads += [(step * (k + 1), _SAMPLE) for k in range(_SAMPLES)]
            for offset, length in reads:
                handle.seek(offset)
                digest.update(handle.read(length))
    return digest.hexdigest()


def attach_lora(model: Any, config: LearnerConfig) -> Any:
    """A peft model with a fresh LoRA (rank, alpha, dropout, targets from `config`).

    Only the LoRA weights are trainable; B starts at zero so outputs equal the base's.
    With `lora_layers` N > 0 only the top N transformer layers get one (every layer when
    the model has no more than N).
    """
    from peft import LoraConfig, get_peft_model

    layers = int(model.config.num_hidden_layers)
    top = (
        list(range(layers - config.lora_layers, layers))
        if 0 < config.lora_layers < layers
        else None  # every layer
    )
    lora = LoraConfig(
        r=config.lora_rank,
        layers_to_transform=top,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_targets),
        bias="none",
        task_type="CAUSAL_LM",
        init_lora_weights=True,
    )
    try:
        return get_peft_model(model, lora)
    except ValueError as exc:  # peft: target modules not found in the base model
        raise AdapterError(f"cannot attach LoRA with targets {config.lora_targets}: {exc}") from exc


def save_adapter(
    model: Any,
    parent: str | Path,
    *,
    version: int,
    base_model: str,
    fingerprint: str,
    step: int,
    config: LearnerConfig,
    prefix: str = "policy",
) -> Path:
    """Save the peft model's adapter as `<parent>/<prefix>@v<version>`, atomically.

    Refuses to replace an existing version: a published name always means one set of
    weights. Returns the final folder.
    """

    def files(tmp: Path) -> None:
        model.save_pretrained(str(tmp))

    return _write_adapter(
        Path(parent), adapter_name(version, prefix), files, version=version,
        base_model=base_model, fingerprint=fingerprint, step=step, config=config,
    )  # fmt: skip


def zero_adapter(model: str, parent: str | Path, config: LearnerConfig) -> Path:
    """v0 for `model` (a folder or a hub name): a LoRA of the learner's rank and targets
    whose weights are all zero, so the adapted model equals the base model (every request
    names an adapter; see `policy.adapters`). Made once under `parent`, in a folder named
    by the base model's fingerprint and the LoRA's shape, and checked against its manifest
    when reused. The model is built on the meta device: no weights are loaded."""
    fingerprint = base_fingerprint(model) if Path(model).is_dir() else f"hub:{model}"
    shape = f"r{config.lora_rank}a{config.lora_alpha}-{len(config.lora_targets)}t"
    key = fingerprint.removeprefix("hub:").replace("/", "--")[:40]
    root = Path(parent) / f"zero-{key}-{shape}"
    folder = root / adapter_name(0)
    if folder.is_dir():
        try:
            manifest = _policy.read_manifest(folder)
        except AdapterManifestError as exc:
            raise AdapterError(f"{folder} is not a usable v0 ({exc}); remove it") from exc
        if manifest.version != 0 or manifest.base_fingerprint != fingerprint:
            raise AdapterError(f"{folder} exists but is not v0 of {model}; remove it")
        return folder
    return _write_zero_adapter(model, root, fingerprint, config)


def _write_zero_adapter(model: str, root: Path, fingerprint: str, config: LearnerConfig) -> Path:
    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model))  # type: ignore[no-untyped-call]
    peft_model = attach_lora(base, config)
    weights = {
        name: torch.zeros(tensor.shape, dtype=torch.float32)
        for name, tensor in get_peft_model_state_dict(peft_model).items()
    }

    def files(tmp: Path) -> None:
        peft_config = peft_model.peft_config["default"]
        peft_config.base_model_name_or_path = model
        peft_config.save_pretrained(str(tmp))
        save_file(weights, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})

    return _write_adapter(
        root, adapter_name(0), files, version=0, base_model=model, fingerprint=fingerprint,
        step=0, config=config,
    )  # fmt: skip


def _write_adapter(
    root: Path,
    name: str,
    files: Callable[[Path], None],
    *,
    version: int,
    base_model: str,
    fingerprint: str,
    step: int,
    config: LearnerConfig,
) -> Path:
    """`files(tmp)` writes peft's two files; the manifest (their hash) goes in last and the
    folder appears as `root/name` whole or not at all (`runtime.base.files.write_folder`)."""

    def fill(tmp: Path) -> None:
        files(tmp)
        if not (tmp / ADAPTER_WEIGHTS).is_file() or not (tmp / ADAPTER_CONFIG).is_file():
            raise AdapterError(f"peft did not write {ADAPTER_WEIGHTS} and {ADAPTER_CONFIG}")
        manifest = AdapterManifest(
            name=name,
            version=version,
            base_model=base_model,
            base_fingerprint=fingerprint,
            weights_sha256=_policy.weights_sha256(tmp),
            step=step,
            created_at=time.time(),
            lora_rank=config.lora_rank,
            lora_alpha=config.lora_alpha,
            target_modules=list(config.lora_targets),
        )
        (tmp / MANIFEST).write_bytes(msgspec.json.format(msgspec.json.encode(manifest)))

    try:
        return write_folder(root / name, fill)
    except FileExistsError as exc:
        raise AdapterError(f"{root / name} exists: adapter versions are never overwritten") from exc


def verify_adapter(folder: str | Path, *, fingerprint: str | None = None) -> AdapterManifest:
    """Check an adapter folder before it is served or loaded; returns its manifest.

    Refuses (AdapterError) what `policy.adapters.read_manifest` refuses (no manifest, a
    manifest that does not decode, no adapter config, weights whose sha256 differs from
    the manifest's) and, when `fingerprint` is given, an adapter of another base model.
    """
    root = Path(folder)
    try:
        manifest = _policy.read_manifest(root)
    except AdapterManifestError as exc:
        raise AdapterError(str(exc)) from exc
    if not (root / ADAPTER_WEIGHTS).is_file():
        raise AdapterError(f"{root}: {ADAPTER_WEIGHTS} missing")
    if fingerprint is not None and manifest.base_fingerprint != fingerprint:
        raise AdapterError(
            f"{root}: trained on base {manifest.base_fingerprint[:12]}..., "
            f"not on this base {fingerprint[:12]}..."
        )
    return manifest
