"""The precision and device of the learner's and BC's forward passes: the device "auto"
names, and whether matrix products run in bfloat16 autocast (`learner.compute_dtype`).

On a CPU, "auto" times bfloat16 against float32 once per process (`cpu_bfloat16_faster`):
CPU flags do not tell which is faster.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import structlog

log = structlog.get_logger("learner.precision")

__all__ = [
    "BF16_MIN_SPEEDUP",
    "bfloat16_speedup",
    "compute_autocast",
    "cpu_bfloat16_faster",
    "resolve_device",
]


def resolve_device(device: str) -> str:
    """ "auto" -> "cuda" when torch sees a GPU, else "cpu"."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def compute_autocast(setting: str, device: str) -> AbstractContextManager[Any]:
    """The context the learner's forward (and so backward) passes run in, for
    `learner.compute_dtype` on `device`: bfloat16 autocast, or nothing (float32).

    "auto" takes bfloat16 on a CUDA GPU that supports it, and on a CPU where it is measured
    faster (`cpu_bfloat16_faster`).
    """
    import torch

    if setting == "auto":
        use = torch.cuda.is_bf16_supported() if device == "cuda" else cpu_bfloat16_faster()
    else:
        use = setting == "bfloat16"
    if not use:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype=torch.bfloat16)


@functools.cache
def cpu_bfloat16_faster() -> bool:
    """Whether bfloat16 autocast runs a transformer MLP's forward+backward (1,024 tokens,
    SmolLM2's widths) at least `BF16_MIN_SPEEDUP` faster than float32 on this CPU: timed
    once per process, about 1 s, and logged (`learner.compute_dtype`). CPU flags do not
    tell: with AVX512-BF16 and no AMX, BC of SmolLM2 ran 1.7x faster in bfloat16 on a Zen 4
    and 1.6x slower on a Xeon (437 against 271 trained tokens/s in float32 and bfloat16;
    this block 44 against 72 ms). Without oneDNN's bfloat16 kernels it is not timed:
    emulated bfloat16 is slower."""
    import torch

    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    # The first call may come from inside a no-grad or inference block (an evaluation).
    with torch.inference_mode(False), torch.enable_grad():
        pairs = _time_bfloat16()
    speedup = bfloat16_speedup(pairs)
    faster = speedup >= BF16_MIN_SPEEDUP
    log.info(
        "learner.compute_dtype",
        bfloat16=faster,
        speedup=round(speedup, 2),
        pairs_ms=[(round(b * 1e3), round(f * 1e3)) for b, f in pairs],
    )
    return faster


BF16_MIN_SPEEDUP = 1.1


def bfloat16_speedup(pairs: Sequence[tuple[float, float]]) -> float:
    """float32 time over bfloat16 time, the median over back-to-back (bfloat16, float32)
    timings. On a shared CPU the load changes from one run to the next: each pair sees
    about the same load, and the median ignores the pairs a change fell into. (The best
    of 3 of each, taken apart, flipped between True and False on a Zen 4 running
    rollouts, where the median of 9 pairs said 1.2-1.5x.)"""
    if not pairs:
        raise ValueError("no timings")
    ratios = sorted(f32 / bf16 for bf16, f32 in pairs)
    middle = len(ratios) // 2
    if len(ratios) % 2:
        return ratios[middle]
    return (ratios[middle - 1] + ratios[middle]) / 2


def _time_bfloat16(pairs: int = 7) -> list[tuple[float, float]]:
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 576, generator=generator)
    up = torch.randn(1536, 576, generator=generator, requires_grad=True)
    down = torch.randn(576, 1536, generator=generator, requires_grad=True)

    def seconds(bf16: bool) -> float:
        began = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = F.linear(F.silu(F.linear(x, up)), down)
        y.float().square().mean().backward()  # type: ignore[no-untyped-call]
        return time.perf_counter() - began

    seconds(True), seconds(False)  # first calls pick and cache kernels
    return [(seconds(True), seconds(False)) for _ in range(pairs)]
