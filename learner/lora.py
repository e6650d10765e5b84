"""LoRA adapters: attach to a base model, save atomically with a manifest, verify.

An adapter folder is what vLLM loads (peft's `save_pretrained` layout:
`adapter_config.json` + `adapter_model.safetensors`) plus `manifest.json`
(`runtime.messages.AdapterManifest`). Saving:

1. `save_pretrained` into a temporary folder beside the final one (same parent, so the
   rename is atomic on one file system);
2. fsync every file;
3. hash `adapter_model.safetensors` (sha256) and write `manifest.json` LAST, fsynced;
4. fsync the folder, rename it to `<parent>/<prefix>@v<N>`, fsync the parent.

A folder without a manifest, or whose weights do not hash to the manifest's, is
half-written or corrupted: `verify_adapter` refuses it, and it is never published.

The base fingerprint (`base_fingerprint`) identifies the base model's files cheaply:
sha256 over the sorted names and sizes of its config, tokenizer and weight files and their
contents, where a weight file above 64 MiB contributes only its first and last MiB and 16
evenly spaced 64 KiB samples (so a 15 GB model is fingerprinted in milliseconds, and any
re-training that touches every tensor still changes it).

v0 is zero-initialised: peft's default init draws A at random and sets B to zero, so
B @ A = 0 and the adapted model's outputs equal the base model's exactly.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

from learner.errors import AdapterError
from policy import adapters as _policy
from policy.errors import AdapterManifestError
from runtime.config import LearnerConfig
from runtime.messages import AdapterManifest

__all__ = [
    "ADAPTER_WEIGHTS",
    "MANIFEST",
    "adapter_name",
    "attach_lora",
    "base_fingerprint",
    "fsync_dir",
    "fsync_tree",
    "save_adapter",
    "verify_adapter",
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


def fsync_tree(folder: Path) -> None:
    """fsync every file under `folder`, then the folders themselves."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
        fsync_dir(sub)
    fsync_dir(folder)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    root = Path(parent)
    root.mkdir(parents=True, exist_ok=True)
    name = adapter_name(version, prefix)
    final = root / name
    if final.exists():
        raise AdapterError(f"{final} exists: adapter versions are never overwritten")
    tmp = root / f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(str(tmp))
        weights = tmp / ADAPTER_WEIGHTS
        if not weights.is_file() or not (tmp / ADAPTER_CONFIG).is_file():
            raise AdapterError(f"peft did not write {ADAPTER_WEIGHTS} and {ADAPTER_CONFIG}")
        fsync_tree(tmp)
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
        _write_synced(tmp / MANIFEST, msgspec.json.format(msgspec.json.encode(manifest)))
        fsync_dir(tmp)
        tmp.rename(final)
        fsync_dir(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # already gone after a successful rename
    return final


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


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
