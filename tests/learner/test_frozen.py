"""The frozen bottom layers run once per micro-batch of an update (learner/frozen.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from learner.checkpoint import Ledger
from learner.demos import BCExample
from learner.engine import Engine, split_difference
from learner.frozen import bottom_output, frozen_layers, top_layers_only
from runtime.base.config import LearnerConfig
from runtime.base.messages import TrajectoryGroup
from tests.learner.conftest import random_demos

MakeGroup = Callable[..., TrajectoryGroup]

# The update's every forward: old log-probs recomputed, the reference (kl_beta), two passes,
# the BC term in each.
CONFIG = LearnerConfig(
    batch_groups=2,
    lora_rank=4,
    lora_alpha=8,
    lora_layers=2,
    learning_rate=1e-2,
    optimizer_steps=2,
    micro_batch_tokens=64,
    recompute_logprobs=True,
    kl_beta=0.05,
    bc_coef=0.5,
    bc_turns=4,
    bc_demos="demos.jsonl",
    compute_dtype="float32",
)


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory: pytest.TempPathFactory, tiny_qwen: Callable[..., Any]) -> Path:
    """A saved randomly initialised 4-layer Qwen2: LoRA on the top 2 leaves 2 frozen."""
    out = tmp_path_factory.mktemp("models") / "four"
    tiny_qwen(vocab=500, layers=4).save_pretrained(out)
    return out


def demos() -> list[BCExample]:
    return random_demos(5, 8)


def test_an_update_runs_the_frozen_layers_once_and_trains_the_same_adapter(
    tmp_path: Path, four_layers: Path, make_group: MakeGroup
) -> None:
    from safetensors.torch import load_file

    groups = [
        make_group(1, group_id="a", rewards=[1, 0, 1], vocab=500),
        make_group(2, group_id="b", rewards=[0, 1], vocab=500),
    ]
    weights: dict[bool, dict[str, Any]] = {}
    calls: dict[bool, int] = {}
    metrics: dict[bool, dict[str, float]] = {}
    for reuse in (False, True):
        cfg = msgspec.structs.replace(CONFIG, reuse_frozen=reuse)
        engine = Engine(cfg, base_model=four_layers, out_dir=tmp_path / str(reuse), demos=demos())
        engine.open()
        assert engine._frozen == (2 if reuse else 0)
        layers = engine._model.get_base_model().model.layers
        calls[reuse] = 0

        def count(*_: Any, _reuse: bool = reuse) -> None:
            calls[_reuse] += 1

        layers[0].register_forward_pre_hook(count)
        result = engine.update(groups, Ledger())
        metrics[reuse] = result.metrics
        weights[reuse] = load_file(str(result.adapter_path / "adapter_model.safetensors"))
        assert len(engine._model.get_base_model().model.layers) == 4  # restored
    for key, value in weights[False].items():
        torch.testing.assert_close(weights[True][key], value, rtol=0, atol=1e-6)
    for key in ("loss", "ref_kl", "bc_nll"):
        assert metrics[True][key] == pytest.approx(metrics[False][key], rel=1e-5, abs=1e-8)
    # The bottom ran for the old log-probs, the reference and the two passes (4x) over the
    # groups' micro-batches, and in both passes over the BC term's; reused, once each.
    groups_mb = int(metrics[True]["micro_batches"])
    demos_mb = calls[True] - groups_mb
    assert groups_mb >= 2 and demos_mb >= 1, calls
    assert calls[False] == 4 * groups_mb + 2 * demos_mb, (calls, groups_mb, demos_mb)


def test_a_model_whose_split_differs_runs_whole(
    tmp_path: Path, four_layers: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import learner.engine

    monkeypatch.setattr(learner.engine, "split_difference", lambda *_: 0.5)
    engine = Engine(CONFIG, base_model=four_layers, out_dir=tmp_path, demos=demos())
    engine.open()
    assert engine._frozen == 0


def test_the_split_forward_is_the_whole_one(four_layers: Path) -> None:
    from transformers import AutoModelForCausalLM

    from learner.lora import attach_lora

    model = attach_lora(
        AutoModelForCausalLM.from_pretrained(four_layers, dtype=torch.float32), CONFIG
    )
    for name, param in model.named_parameters():
        if "lora_B" in name:  # the adapter changes the top layers' output
            torch.nn.init.normal_(param, std=0.1)
    assert frozen_layers(model) == 2
    assert split_difference(model, 2, torch.autocast("cpu", enabled=False)) == 0.0
    # The bottom's output is the whole forward's hidden state after layer 2.
    batch_ids = torch.tensor([[5, 6, 7, 8]])
    whole = model(input_ids=batch_ids, output_hidden_states=True, use_cache=False)
    from learner.batch import MicroBatch

    ones = torch.ones_like(batch_ids)
    mb = MicroBatch(
        input_ids=batch_ids, attention_mask=ones, position_ids=torch.arange(4)[None],
        targets=batch_ids[:, :1], weights=ones[:, :1].float(), old_logprobs=ones[:, :1].float(),
        advantages=torch.zeros(1), has_old_logprobs=False,
    )  # fmt: skip
    below = bottom_output(model, mb, 2)
    torch.testing.assert_close(below.hidden, whole.hidden_states[2], rtol=0, atol=1e-6)
    # A failure inside leaves the model whole.
    with pytest.raises(RuntimeError, match="inside"), top_layers_only(model, 2):
        assert len(model.get_base_model().model.layers) == 2
        raise RuntimeError("inside")
    assert len(model.get_base_model().model.layers) == 4
    assert frozen_layers(torch.nn.Linear(2, 2)) == 0  # no layers to split


def test_a_webrl_phase_trains_the_same_actor_with_the_frozen_bottom_kept(
    tmp_path: Path, four_layers: Path, make_group: MakeGroup
) -> None:
    from safetensors.torch import load_file

    from learner.webrl_engine import WebRLEngine
    from runtime.base.config import WebRLConfig

    groups = [
        make_group(1, group_id="a", rewards=[1, 0, 1], vocab=500),
        make_group(2, group_id="b", rewards=[0, 1], vocab=500),
    ]
    cfg = LearnerConfig(
        algorithm="webrl", batch_groups=2, lora_rank=4, lora_alpha=8, lora_layers=2,
        learning_rate=1e-2, optimizer_steps=2, micro_batch_tokens=64, compute_dtype="float32",
    )  # fmt: skip
    weights = {}
    for reuse in (False, True):
        engine = WebRLEngine(
            msgspec.structs.replace(cfg, reuse_frozen=reuse),
            WebRLConfig(critic_steps=2, critic_batch=4),
            base_model=four_layers,
            out_dir=tmp_path / str(reuse),
        )
        engine.open()
        assert engine._frozen == (2 if reuse else 0)
        result = engine.update(groups, Ledger())
        assert result.metrics["samples"] > 0
        weights[reuse] = load_file(str(result.adapter_path / "adapter_model.safetensors"))
    assert any(v.abs().sum() > 0 for k, v in weights[True].items() if "lora_B" in k)  # trained
    for key, value in weights[False].items():
        torch.testing.assert_close(weights[True][key], value, rtol=0, atol=1e-6)
