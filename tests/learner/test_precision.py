"""learner.precision: bfloat16 autocast where "auto" measures it faster, the timing's median."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("setting", ["float32", "bfloat16", "auto"])
def test_compute_autocast_sets_the_dtype_of_matrix_products(setting: str) -> None:
    """`learner.compute_dtype`: float32 leaves products alone, bfloat16 autocasts them,
    "auto" takes bfloat16 exactly where this CPU's timing found it faster."""
    import torch

    from learner.precision import compute_autocast, cpu_bfloat16_faster

    cpu_bfloat16_faster.cache_clear()
    with torch.no_grad():  # a first call from an evaluation still times with gradients
        native = cpu_bfloat16_faster()
    want = {"float32": False, "bfloat16": True, "auto": native}[setting]
    a = torch.ones(4, 4)
    with compute_autocast(setting, "cpu"):
        product = a @ a
    assert product.dtype == (torch.bfloat16 if want else torch.float32)


def test_bfloat16_is_timed_only_where_onednn_has_its_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without oneDNN's bfloat16 kernels "auto" is float32 at once (no timing: emulated
    bfloat16 is slower); the answer is cached for the process."""
    import torch

    from learner import precision

    precision.cpu_bfloat16_faster.cache_clear()
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    try:
        assert precision.cpu_bfloat16_faster() is False
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
        assert precision.cpu_bfloat16_faster() is False  # cached
    finally:
        precision.cpu_bfloat16_faster.cache_clear()


def test_bfloat16_speedup_is_the_median_of_back_to_back_pairs() -> None:
    """A load change inside a pair (here the 2nd and 5th) does not decide: the best of each
    precision taken apart would say bfloat16 is slower (0.045 against 0.040 s)."""
    from learner.precision import BF16_MIN_SPEEDUP, bfloat16_speedup

    pairs = [(0.06, 0.10), (0.20, 0.04), (0.05, 0.09), (0.045, 0.08), (0.30, 0.12)]
    assert bfloat16_speedup(pairs) == pytest.approx(0.10 / 0.06)
    assert bfloat16_speedup(pairs) >= BF16_MIN_SPEEDUP
    assert bfloat16_speedup([(1.0, 1.0), (1.0, 2.0)]) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="no timings"):
        bfloat16_speedup([])


def test_the_bfloat16_decision_is_logged_with_its_timings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch
    from structlog.testing import capture_logs

    from learner import precision

    precision.cpu_bfloat16_faster.cache_clear()
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    monkeypatch.setattr(precision, "_time_bfloat16", lambda: [(0.05, 0.04), (0.05, 0.06)])
    try:
        with capture_logs() as logs:
            assert precision.cpu_bfloat16_faster() is False  # median 1.0x: under 1.1x
    finally:
        precision.cpu_bfloat16_faster.cache_clear()
    (entry,) = [e for e in logs if e["event"] == "learner.compute_dtype"]
    assert entry["bfloat16"] is False and entry["speedup"] == 1.0
    assert entry["pairs_ms"] == [(50, 40), (50, 60)]
