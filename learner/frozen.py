"""The frozen bottom of the model, run once per micro-batch of an update.

With `learner.lora_layers` N, LoRA sits on the top N transformer layers only. The layers
below are the base model's for every forward an update makes over the same micro-batch:
the reference log-probs (adapter disabled), each of the `optimizer_steps` passes, and the
BC term's turns in each pass. Their output, the hidden state that enters the lowest
adapted layer, is computed once without grad (`bottom_output`), and those forwards run
the top layers from it (`top_layers_only` with `inputs_embeds`).

An update of SmolLM2 (30 layers, the top 10 adapted) with the reference and two passes
ran the 20 bottom layers 3 times a micro-batch; now once: 16 sampled turns and the BC
term's 16, 2 threads, 48.5 s an update against 61.3 s (`python -m bench.learner`).

The split relies on the model's forward taking `inputs_embeds` as the first layer's input
and looping over its `layers` list, which holds for the Llama family (SmolLM2, Qwen2,
Mistral) in transformers 5. `learner.engine.split_difference` compares both ways on a
short sequence when the learner opens; a model whose log-probs differ is run whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

__all__ = ["TOLERANCE", "BottomOutput", "bottom_output", "frozen_layers", "top_layers_only"]

# Largest log-prob difference between the split and the whole forward that the learner
# accepts (`learner.engine.split_difference`): the same operations in the same order
# (measured 0.0 on SmolLM2, float32 and bfloat16 autocast).
TOLERANCE = 1e-4


@dataclass(frozen=True, slots=True)
class BottomOutput:
    """The hidden state of a micro-batch after its `layers` frozen bottom layers."""

    hidden: torch.Tensor
    layers: int


class Batch(Protocol):
    """What the bottom's forward reads of a micro-batch (`learner.batch.MicroBatch`)."""

    @property
    def input_ids(self) -> torch.Tensor: ...
    @property
    def attention_mask(self) -> torch.Tensor: ...
    @property
    def position_ids(self) -> torch.Tensor: ...


class _Reached(Exception):
    """Raised by the hook on the last frozen layer: the rest of the forward is not needed."""


def _decoder(model: Any) -> Any:
    """The module that holds the transformer `layers` (peft model or not)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder()


def frozen_layers(model: Any) -> int:
    """How many layers from the bottom carry no trainable parameter (0 when the lowest
    layer is adapted, or the model has no `layers` list this module knows)."""
    try:
        layers = _decoder(model).layers
    except AttributeError:
        return 0
    for index, layer in enumerate(layers):
        if any(p.requires_grad for p in layer.parameters()):
            return index
    return 0  # nothing trainable: nothing to split for


def bottom_output(model: Any, batch: Batch, frozen: int) -> BottomOutput:
    """The hidden state of `batch` after the model's `frozen` bottom layers, without grad."""
    import torch

    captured: list[torch.Tensor] = []

    def hook(module: Any, args: Any, output: Any) -> None:
        captured.append(output[0] if isinstance(output, tuple) else output)
        raise _Reached

    handle = _decoder(model).layers[frozen - 1].register_forward_hook(hook)
    try:
        with torch.no_grad():
            model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                use_cache=False,
            )
    except _Reached:
        pass
    finally:
        handle.remove()
    return BottomOutput(hidden=captured[0].detach(), layers=frozen)


@contextlib.contextmanager
def top_layers_only(model: Any, frozen: int) -> Iterator[None]:
    """While inside, the model's forward runs its layers from `frozen` up only, on the
    `inputs_embeds` it is given (`bottom_output`)."""
    import torch

    decoder = _decoder(model)
    whole = decoder.layers
    decoder.layers = torch.nn.ModuleList(list(whole)[frozen:])
    try:
        yield
    finally:
        decoder.layers = whole
