"""A hand-set induction circuit for a freshly made tiny Qwen2: look-up-and-copy from step 0.

Trained from random weights on look-up tasks alone, the tiny model does not learn to copy
within a CPU budget (`python -m bench.copyform`: the id after an entity's words on a
compact page stays at chance after 300-1000 steps; a run repeated at a random distance
too). Copying that works at any distance is an induction head: a first-layer head writes
each position's previous token into it, and a second-layer head finds where the current
token stood before and copies what followed it. Gradient descent reaches that pair only
after a long plateau, so this writes it into the initial weights instead, and behaviour
cloning trains the rest of the model around it (`freeze_induction`). It does not make BC
faster on the built-in tasks (README: a reply writes the element id as digits after
`element="`, not after the entity's words), so tiny models are made without it by default.

The last `head_dim` dimensions of the residual stream per planted key-value head are
reserved for the previous token: they are zeroed in every embedding row (the tied output
head does not read them), and layer 0 writes the previous token there.

- Layer 0, the first query head of each planted key-value head: query and key are
  constant (biases only); RoPE turns their product into a function of the distance alone,
  and the biases are set so that it peaks at a distance of one on the fast-rotating pairs.
  Value and output move the token's share (`head_dim` dimensions of the embedding) into
  the reserved dimensions.
- Layer 1, the same heads: the query reads the current token's share, the key reads the
  previous token's, through the same random projection onto RoPE's slowest pairs (so the
  match barely depends on distance); value and output copy the matched position's token
  share, amplified, back onto the token's share.
- The other query heads' outputs and both MLPs' down projections are scaled down (0.1), so
  the circuit is not drowned in noise; they train and grow.

Measured on the fresh tiny model (hidden 256, 2 layers; `bench.copyform`): one planted head
looks the id up on compact page lines 0.89 of the time at step 0, where 300 steps of
training on look-ups alone leave the fresh model at chance.

`plant_induction` changes the model in place; nothing else about the model changes (it is
a plain Qwen2 that transformers and vLLM load).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

__all__ = ["freeze_induction", "plant_induction"]

# Pairs of RoPE rotating at most this many radians a position carry the token match.
_SLOW_RADIANS = 1e-3
# Fast pairs that place the previous-token head's peak, and its logit scale.
_FAST_PAIRS = 8
_PREVIOUS_SCALE = 120.0


class _Layout(NamedTuple):
    """Where the circuit of `used` key-value heads sits in a model."""

    head_dim: int
    per_kv: int  # query heads per key-value head; head kv * per_kv is planted
    reserved: int  # the previous tokens' dimensions: reserved to the end of the residual


def _layout(config: Any, used: int) -> _Layout:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_kv = config.num_attention_heads // config.num_key_value_heads
    return _Layout(head_dim, per_kv, config.hidden_size - used * head_dim)


def plant_induction(
    model: Any,
    *,
    seed: int = 0,
    kv_heads_used: int | None = None,
    match_scale: float = 16.0,
    copy_gain: float = 6.0,
    rest_scale: float = 0.1,
) -> None:
    """Write the induction circuit into the first two layers of `model` (a Qwen2ForCausalLM).

    The circuit takes the first query head of `kv_heads_used` key-value heads (default
    all) in each of the two layers (`freeze_induction` keeps them as set). `match_scale`
    sharpens the second layer's token match, `copy_gain` weighs the copied token against
    the current one in the output; the other heads' outputs and the MLPs' down projections
    are scaled by `rest_scale` (random weights at full scale drown the circuit: look-up
    0.41 right at 0.3, 0.89 at 0.1). Raises ValueError for a model it does not fit (fewer
    than two layers, too few key-value heads, an untied output head, no slow RoPE pair).
    """
    import torch

    config = model.config
    hidden = config.hidden_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    used = kv_heads if kv_heads_used is None else kv_heads_used
    head_dim, per_kv, reserved = _layout(config, used)
    if config.num_hidden_layers < 2:
        raise ValueError(
            f"an induction circuit needs 2 layers, the model has {config.num_hidden_layers}"
        )
    if not 1 <= used <= kv_heads or 2 * used * head_dim > hidden:
        raise ValueError(
            f"{used} key-value heads of {head_dim} do not fit twice in hidden size {hidden} "
            f"({kv_heads} key-value heads)"
        )
    if not config.tie_word_embeddings:
        raise ValueError("the induction circuit assumes tied input and output embeddings")
    theta = config.rope_parameters["rope_theta"]
    frequencies = [theta ** (-2 * j / head_dim) for j in range(head_dim // 2)]
    slow = [j for j, f in enumerate(frequencies) if f <= _SLOW_RADIANS]
    if not slow:
        raise ValueError(f"rope_theta {theta}: no RoPE pair is slow enough to match tokens by")
    match_dims = slow + [j + head_dim // 2 for j in slow]
    planted = {kv * per_kv for kv in range(used)}
    generator = torch.Generator().manual_seed(seed)

    with torch.no_grad():
        embedding = model.get_input_embeddings().weight
        embedding[:, reserved:] = 0.0
        norm = embedding.norm(dim=1).median().item()
        # RMSNorm scales a row to norm sqrt(hidden); this brings a share back to the
        # embedding's scale (the token and its predecessor then weigh alike).
        rescale = norm / math.sqrt(hidden) * math.sqrt(2)
        first, second = model.model.layers[0], model.model.layers[1]
        for layer in (first, second):
            layer.mlp.down_proj.weight.mul_(rest_scale)
            for head in set(range(heads)) - planted:
                _rows(layer.self_attn.o_proj.weight.T, head, head_dim).mul_(rest_scale)
        for kv in range(used):
            head = kv * per_kv
            token_share = slice(kv * head_dim, (kv + 1) * head_dim)
            previous_share = slice(reserved + kv * head_dim, reserved + (kv + 1) * head_dim)

            attention = first.self_attn
            _, query_bias, _, key_bias = _clear_query_key(attention, head, kv, head_dim)
            for j in range(_FAST_PAIRS):
                # q . k after RoPE = sum_j cos(f_j (distance - 1)) * scale: peaks at distance 1.
                query_bias[j] = _PREVIOUS_SCALE * math.cos(frequencies[j])
                query_bias[j + head_dim // 2] = -_PREVIOUS_SCALE * math.sin(frequencies[j])
                key_bias[j] = 1.0
            _copy(
                attention,
                head=head,
                kv=kv,
                head_dim=head_dim,
                source=token_share,
                target=previous_share,
                gain=rescale,
            )

            attention = second.self_attn
            projection = torch.randn(len(match_dims), head_dim, generator=generator)
            projection /= math.sqrt(head_dim)
            query, _, key, _ = _clear_query_key(attention, head, kv, head_dim)
            query[match_dims, token_share] = projection * match_scale
            key[match_dims, previous_share] = projection
            _copy(
                attention,
                head=head,
                kv=kv,
                head_dim=head_dim,
                source=token_share,
                target=token_share,
                gain=rescale * copy_gain,
            )


def freeze_induction(model: Any, kv_heads_used: int) -> list[Any]:
    """Keep the circuit `plant_induction(model, kv_heads_used=...)` wrote as it is in
    training: gradient hooks zero the gradients of its weights (the planted heads' query,
    key, value and output rows, and the embedding's previous-token dimensions). Behaviour
    cloning overwrites an unfrozen circuit within 500 steps. Weight decay would still
    shrink them (BC's default is none). Returns the hook handles."""
    import torch

    head_dim, per_kv, reserved = _layout(model.config, kv_heads_used)
    masks: dict[int, tuple[Any, Any]] = {}  # id -> (parameter, entries kept)

    def mask(parameter: Any) -> Any:
        if id(parameter) not in masks:
            masks[id(parameter)] = (parameter, torch.zeros_like(parameter, dtype=torch.bool))
        return masks[id(parameter)][1]

    mask(model.get_input_embeddings().weight)[:, reserved:] = True
    for layer in model.model.layers[:2]:
        attention = layer.self_attn
        for kv in range(kv_heads_used):
            head = kv * per_kv
            for projection, index in (
                (attention.q_proj, head),
                (attention.k_proj, kv),
                (attention.v_proj, kv),
            ):
                _rows(mask(projection.weight), index, head_dim)[:] = True
                _rows(mask(projection.bias), index, head_dim)[:] = True
            _rows(mask(attention.o_proj.weight).T, head, head_dim)[:] = True
    return [
        parameter.register_hook(lambda grad, keep=keep: grad.masked_fill(keep, 0.0))
        for parameter, keep in masks.values()
    ]


def _rows(weight: Any, index: int, size: int) -> Any:
    """Rows `index * size` to `(index + 1) * size` of `weight` (a view)."""
    return weight[index * size : (index + 1) * size]


def _clear_query_key(attention: Any, head: int, kv: int, head_dim: int) -> tuple[Any, ...]:
    """Zero query head `head`'s and key-value head `kv`'s query and key rows; returns the
    views (query weight, query bias, key weight, key bias) to set."""
    views = (
        _rows(attention.q_proj.weight, head, head_dim),
        _rows(attention.q_proj.bias, head, head_dim),
        _rows(attention.k_proj.weight, kv, head_dim),
        _rows(attention.k_proj.bias, kv, head_dim),
    )
    for view in views:
        view.zero_()
    return views


def _copy(
    attention: Any, *, head: int, kv: int, head_dim: int, source: slice, target: slice, gain: float
) -> None:
    """Key-value head `kv`'s value reads `source` of the residual; query head `head`'s
    output writes it, times `gain`, to `target`."""
    import torch

    width = source.stop - source.start
    value = _rows(attention.v_proj.weight, kv, head_dim)
    value.zero_()
    _rows(attention.v_proj.bias, kv, head_dim).zero_()
    value[:width, source] = torch.eye(width)
    output = _rows(attention.o_proj.weight.T, head, head_dim)
    output.zero_()
    output[:width, target] = torch.eye(width) * gain
