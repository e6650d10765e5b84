"""The grouped multi-LoRA ops equal vLLM's own CPU ops, and the plugin installs them only
when asked (the served log-probs of a grouped server are checked against the learner's in
test_pretrained.py and test_vllm.py)."""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")
vllm_ops = pytest.importorskip("vllm.lora.ops.torch_ops")

from policy import lora_ops  # noqa: E402

TOKENS, IN, OUT, RANK, SLOTS = 37, 48, 40, 8, 4
# Expanded outputs are sums of 8 products of terms ~14 (shrink) by ~1: entries of ~40
# whose float32 rounding (~5e-6 each) depends on how torch splits the sums among
# threads; an entry that cancels to ~0.002 still carries it (once 1.07e-5, in CI).
EXPAND_ATOL = 1e-4


def _case(indices: list[int], seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(len(indices), IN, generator=gen)
    a = torch.randn(SLOTS, 1, RANK, IN, generator=gen)
    b = torch.randn(SLOTS, 1, OUT, RANK, generator=gen)
    return x, a, b, torch.tensor(indices)


@pytest.mark.parametrize(
    "indices",
    [[2] * TOKENS, [0] * 5 + [3] * 20 + [1] * 12, [1, 0] * 18 + [2]],
    ids=["one adapter", "three in runs", "interleaved"],
)
def test_bgmv_shrink_and_expand_equal_vllms(indices: list[int]) -> None:
    x, a, b, idx = _case(indices)
    want = torch.zeros(len(indices), RANK)
    got = torch.zeros(len(indices), RANK)
    vllm_ops.bgmv_shrink(x, a, want, idx, 0.5)
    lora_ops.OPS["bgmv_shrink"](x, a, got, idx, 0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    base = torch.randn(len(indices), OUT + 3)  # the model's output may be wider
    want_out, got_out = base.clone(), base.clone()
    vllm_ops.bgmv_expand(want, b, want_out, idx, True)
    lora_ops.OPS["bgmv_expand"](got, b, got_out, idx, True)
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=EXPAND_ATOL)

    want_slice, got_slice = base.clone(), base.clone()
    vllm_ops.bgmv_expand_slice(want, b, want_slice, idx, 2, OUT, False)
    lora_ops.OPS["bgmv_expand_slice"](got, b, got_slice, idx, 2, OUT, False)
    torch.testing.assert_close(got_slice, want_slice, rtol=1e-5, atol=EXPAND_ATOL)


def test_sgmv_prefill_equals_vllms() -> None:
    """Prefill: three sequences of 5, 20 and 12 tokens naming adapters 3, 0, 3."""
    seq_lens = torch.tensor([5, 20, 12])
    seq_adapters = torch.tensor([3, 0, 3])
    starts = torch.tensor([0, 5, 25])
    x, a, b, _ = _case([0] * TOKENS, seed=1)
    meta = (starts, seq_lens, seq_adapters, 3, 20, TOKENS)
    want, got = torch.zeros(TOKENS, RANK), torch.zeros(TOKENS, RANK)
    vllm_ops.sgmv_shrink(x, a, want, *meta, 2.0)
    lora_ops.OPS["sgmv_shrink"](x, a, got, *meta, 2.0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    want_out, got_out = torch.ones(TOKENS, OUT), torch.ones(TOKENS, OUT)
    vllm_ops.sgmv_expand(want, b, want_out, *meta, True)
    lora_ops.OPS["sgmv_expand"](got, b, got_out, *meta, True)
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=EXPAND_ATOL)
    want_slice, got_slice = torch.ones(TOKENS, OUT + 8), torch.ones(TOKENS, OUT + 8)
    vllm_ops.sgmv_expand_slice(want, b, want_slice, *meta, 8, OUT, True)
    lora_ops.OPS["sgmv_expand_slice"](got, b, got_slice, *meta, 8, OUT, True)
    torch.testing.assert_close(got_slice, want_slice, rtol=1e-5, atol=EXPAND_ATOL)


def test_a_row_without_adapter_gets_no_lora_term() -> None:
    """Index -1 adds nothing (vLLM's own CPU ops would use the last slot for it)."""
    x, a, _, idx = _case([1, -1, 1, -1])
    out = lora_ops.grouped_products(x, a, idx, torch.float32)
    assert torch.equal(out[1], torch.zeros(RANK)) and torch.equal(out[3], torch.zeros(RANK))
    torch.testing.assert_close(out[0], x[0] @ a[1, 0].T)
    last_slot = torch.zeros(4, RANK)
    vllm_ops.bgmv_shrink(x, a, last_slot, idx, 1.0)
    assert not torch.equal(last_slot[1], torch.zeros(RANK))  # the bug the grouped ops avoid


def test_bfloat16_inputs_multiply_in_the_outputs_dtype() -> None:
    x, a, _, idx = _case([0] * 6)
    out = lora_ops.grouped_products(x.bfloat16(), a.bfloat16(), idx, torch.float32)
    assert out.dtype == torch.float32


def test_register_replaces_the_cpu_wrappers_ops_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    punica_cpu = importlib.import_module("vllm.lora.punica_wrapper.punica_cpu")
    originals = {name: getattr(punica_cpu, name) for name in lora_ops.OPS}
    monkeypatch.delenv(lora_ops.ENV, raising=False)
    lora_ops.register()
    assert all(getattr(punica_cpu, n) is f for n, f in originals.items())
    for name, original in originals.items():
        monkeypatch.setattr(punica_cpu, name, original)  # restored after the test
    monkeypatch.setenv(lora_ops.ENV, "grouped")
    lora_ops.register()
    lora_ops.register()  # vLLM may load plugins twice in one process
    assert all(getattr(punica_cpu, n) is f for n, f in lora_ops.OPS.items())


def test_zero_slots_are_skipped_until_an_adapter_is_written_into_them() -> None:
    """A layer an adapter leaves out has zero matrices: its product is skipped, and the
    first in-place write (vLLM loading an adapter into the slot) is seen."""
    x, a, b, idx = _case([0] * 10 + [2] * 10)
    a[0].zero_()
    a[2].zero_()
    got = torch.full((20, RANK), 7.0)
    lora_ops.OPS["bgmv_shrink"](x, a, got, idx, 1.0)
    assert torch.equal(got, torch.zeros(20, RANK))
    out = torch.ones(20, OUT)
    lora_ops.OPS["bgmv_expand"](got, b, out, idx, True)  # b is not zero, its input is
    assert torch.equal(out, torch.ones(20, OUT))

    a[2].copy_(torch.randn(1, RANK, IN))  # a new adapter in slot 2
    want = torch.zeros(20, RANK)
    vllm_ops.bgmv_shrink(x, a, want, idx, 1.0)
    lora_ops.OPS["bgmv_shrink"](x, a, got, idx, 1.0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[:10], torch.zeros(10, RANK))
