"""LoRA: zero-initialised v0, atomic saves with a manifest, refusal of bad folders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from learner.errors import AdapterError
from learner.lora import (
    ADAPTER_WEIGHTS,
    MANIFEST,
    adapter_name,
    attach_lora,
    base_fingerprint,
    save_adapter,
    verify_adapter,
    zero_adapter,
)
from runtime.base.config import LearnerConfig

CONFIG = LearnerConfig(lora_rank=4, lora_alpha=8)


def load_base(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def nudge(model: Any) -> None:
    """Move every LoRA B away from zero, as training would."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def test_v0_is_identical_to_the_base(tiny_model_dir: Path) -> None:
    base = load_base(tiny_model_dir)
    ids = torch.randint(3, 500, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = base(input_ids=ids).logits.clone()
    peft_model = attach_lora(base, CONFIG)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # one A and one B per targeted linear layer (7 per decoder layer, 2 layers)
    assert len(trainable) == 2 * 7 * 2
    with torch.no_grad():
        got = peft_model(input_ids=ids).logits
    assert torch.equal(got, want)
    nudge(peft_model)
    with torch.no_grad():
        assert not torch.allclose(peft_model(input_ids=ids).logits, want)


def test_save_is_atomic_verified_and_reloadable(tiny_model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel

    model = attach_lora(load_base(tiny_model_dir), CONFIG)
    nudge(model)
    fp = base_fingerprint(tiny_model_dir)
    out = save_adapter(
        model,
        tmp_path / "adapters",
        version=3,
        base_model=str(tiny_model_dir),
        fingerprint=fp,
        step=7,
        config=CONFIG,
    )
    assert out.name == adapter_name(3) == "policy@v3"
    assert {p.name for p in out.iterdir()} >= {"adapter_config.json", ADAPTER_WEIGHTS, MANIFEST}
    assert [p.name for p in (tmp_path / "adapters").iterdir()] == ["policy@v3"]  # no temp left
    manifest = verify_adapter(out, fingerprint=fp)
    assert (manifest.name, manifest.version, manifest.step) == ("policy@v3", 3, 7)
    assert (manifest.lora_rank, manifest.lora_alpha) == (4, 8)
    assert manifest.target_modules == list(CONFIG.lora_targets)
    assert manifest.base_model == str(tiny_model_dir)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 4 and sorted(config["target_modules"]) == sorted(CONFIG.lora_targets)
    # vLLM and peft read the same files: reload and compare outputs
    ids = torch.randint(3, 500, (1, 9), generator=torch.Generator().manual_seed(2))
    reloaded = PeftModel.from_pretrained(load_base(tiny_model_dir), out).eval()
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, model(input_ids=ids).logits)
    with pytest.raises(AdapterError, match="never overwritten"):
        save_adapter(
            model,
            tmp_path / "adapters",
            version=3,
            base_model="x",
            fingerprint=fp,
            step=8,
            config=CONFIG,
        )


def test_half_written_or_tampered_adapters_are_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = attach_lora(load_base(tiny_model_dir), CONFIG)
    fp = base_fingerprint(tiny_model_dir)
    kwargs: dict[str, Any] = dict(base_model="b", fingerprint=fp, step=0, config=CONFIG)
    good = save_adapter(model, tmp_path, version=0, **kwargs)
    verify_adapter(good)
    with pytest.raises(AdapterError, match="not on this base"):
        verify_adapter(good, fingerprint="0" * 64)

    tampered = save_adapter(model, tmp_path, version=1, **kwargs)
    data = bytearray((tampered / ADAPTER_WEIGHTS).read_bytes())
    data[-1] ^= 0xFF
    (tampered / ADAPTER_WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(AdapterError, match="the manifest says"):
        verify_adapter(tampered)

    no_manifest = save_adapter(model, tmp_path, version=2, **kwargs)
    (no_manifest / MANIFEST).unlink()
    with pytest.raises(AdapterError, match=r"no manifest\.json"):
        verify_adapter(no_manifest)

    garbled = save_adapter(model, tmp_path, version=4, **kwargs)
    (garbled / MANIFEST).write_text('{"name": 3}')
    with pytest.raises(AdapterError, match="unreadable manifest"):
        verify_adapter(garbled)


def test_a_failed_save_leaves_nothing(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = attach_lora(load_base(tiny_model_dir), CONFIG)
    real = model.save_pretrained

    def dies_halfway(path: str, **kw: Any) -> None:
        real(path, **kw)
        (Path(path) / ADAPTER_WEIGHTS).write_bytes(b"trunc")
        raise OSError("disk full")

    monkeypatch.setattr(model, "save_pretrained", dies_halfway)
    with pytest.raises(OSError, match="disk full"):
        save_adapter(
            model, tmp_path, version=5, base_model="b", fingerprint="f", step=0, config=CONFIG
        )
    assert list(tmp_path.iterdir()) == []


def test_zero_adapter_is_made_once_equals_the_base_and_refuses_a_stranger(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file

    folder = zero_adapter(str(tiny_model_dir), tmp_path, CONFIG)
    manifest = verify_adapter(folder, fingerprint=base_fingerprint(tiny_model_dir))
    assert manifest.version == 0 and manifest.base_model == str(tiny_model_dir)
    assert json.loads((folder / "adapter_config.json").read_text())["r"] == CONFIG.lora_rank
    weights = load_file(str(folder / ADAPTER_WEIGHTS))
    assert weights and all(not t.any() for t in weights.values())
    ids = torch.randint(3, 500, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = load_base(tiny_model_dir)(input_ids=ids).logits
        adapted = PeftModel.from_pretrained(load_base(tiny_model_dir), str(folder))
        got = adapted(input_ids=ids).logits
    assert torch.equal(got, want)

    made = (folder / MANIFEST).stat().st_mtime_ns
    assert zero_adapter(str(tiny_model_dir), tmp_path, CONFIG) == folder  # reused, not remade
    assert (folder / MANIFEST).stat().st_mtime_ns == made
    (folder / MANIFEST).write_text("{}")
    with pytest.raises(AdapterError, match="not a usable v0"):
        zero_adapter(str(tiny_model_dir), tmp_path, CONFIG)
    assert [p.name for p in tmp_path.iterdir()] == [folder.parent.name]  # no temp folders


def test_bad_targets_are_an_adapter_error(tiny_model_dir: Path) -> None:
    bad = LearnerConfig(lora_targets=("no_such_proj",))
    with pytest.raises(AdapterError, match="no_such_proj"):
        attach_lora(load_base(tiny_model_dir), bad)


def test_fingerprint_tracks_weights_cheaply_for_big_files(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    fp = base_fingerprint(tiny_model_dir)
    assert fp == base_fingerprint(tiny_model_dir)
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text("{}")
    weights = big / "model.safetensors"
    with weights.open("wb") as f:  # 80 MiB, sparse: only the sampled parts are read
        f.truncate(80 << 20)
    first = base_fingerprint(big)
    with weights.open("r+b") as f:
        f.seek(5)
        f.write(b"x")
    second = base_fingerprint(big)
    assert second != first
    with weights.open("r+b") as f:
        f.seek((80 << 20) - 3)
        f.write(b"y")
    assert base_fingerprint(big) != second
    (big / "config.json").write_text('{"a": 1}')
    assert len({first, second, base_fingerprint(big)}) == 3
    with pytest.raises(AdapterError, match="no weight files"):
        base_fingerprint(tmp_path)
