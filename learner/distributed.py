"""Data parallelism of the learner over `torch.distributed`: micro-batches shared among ranks,
LoRA gradients summed across them.

Every rank runs the same `Engine.update` on the same groups (`Engine(data_parallel=...)`):
each builds the same samples and micro-batches, keeps its share of the micro-batches
(`share_micro_batches`), runs forward/backward on them only, then `all_reduce_gradients`
SUMS the trainable parameters' gradients across the ranks before the grad-norm clip and the
AdamW step. Every rank then holds the full-batch gradient and takes the identical step, so
the adapters stay identical; rank 0 alone writes adapters and checkpoints.

Why a SUM, and why it is exact: the M-GRPO loss is a token sum whose weights
1 / (|B| |T_i| |o_ij|) (`learner.batch.build_samples`) and group advantages are computed by
every rank from the WHOLE batch before any split, so each micro-batch's loss is its exact
part of the full-batch loss, independent of which rank computes it. The engine's old
log-probs (the server's, or recomputed micro-batch by micro-batch) and reference log-probs
are per row too, and a share is made of whole micro-batches, padded exactly as in one
process. So the sum over ranks of their accumulated gradients is the single-process
gradient, up to the order of float additions. Averaging (DDP's default) would divide it by
the world size. Two things do differ from one process: with `lora_dropout > 0` each rank
draws its own dropout masks, and an error on one rank (a bad batch, a failed save) is not
seen by the others, which wait in their next collective until the process group's timeout.

Sharing: micro-batches are cut by a budget on padded tokens (rows x longest row), which is
what a forward+backward costs, so they are dealt out by that count: longest first, each
to the rank with the least so far (ties to the lowest rank). Deterministic, every
micro-batch on exactly one rank, and the ranks' loads differ by at most the largest
micro-batch's. A rank may get none (fewer micro-batches than ranks); it still joins the all-reduce.

One collective per optimizer step: all gradients flattened into one bucket, plus one flag
per parameter saying whether the rank has a gradient for it, so that a parameter no rank
has a gradient for keeps none (AdamW then skips it, as in one process) instead of getting
a zero one.

gloo on CPUs, NCCL on GPUs (`DataParallel.start`); tensors given to a collective live on
the backend's device (each rank's own GPU under NCCL).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from learner.batch import TurnSample

if TYPE_CHECKING:
    import torch

__all__ = [
    "DataParallel",
    "all_reduce_gradients",
    "assign_ranks",
    "share_micro_batches",
]

_Batch = TypeVar("_Batch", bound=Sequence[TurnSample])


def assign_ranks(costs: Sequence[int], world_size: int) -> list[int]:
    """The rank of each item: largest cost first, each to the least loaded rank so far
    (ties: the earlier item, the lower rank)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    loads = [0] * world_size
    ranks = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        ranks[i] = rank
        loads[rank] += costs[i]
    return ranks


def share_micro_batches(batches: Sequence[_Batch], *, rank: int, world_size: int) -> list[_Batch]:
    """This rank's micro-batches (in their given order), balanced by padded tokens."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    costs = [len(b) * max((s.length for s in b), default=0) for b in batches]
    ranks = assign_ranks(costs, world_size)
    return [b for b, r in zip(batches, ranks, strict=True) if r == rank]


def all_reduce_gradients(params: Sequence[torch.Tensor], group: Any = None) -> None:
    """Sum every parameter's gradient across the ranks of `group`, in one flattened bucket.

    A rank without a gradient for a parameter contributes zeros; a parameter that has no
    gradient on any rank keeps `grad = None`. The parameters must share one dtype and device.
    """
    import torch
    import torch.distributed as dist

    if not params:
        return
    dtype, device = params[0].dtype, params[0].device
    if any(p.dtype != dtype or p.device != device for p in params):
        raise ValueError("all_reduce_gradients needs parameters of one dtype and device")
    pieces = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
    have = torch.tensor([p.grad is not None for p in params], dtype=dtype, device=device)
    bucket = torch.cat([t.reshape(-1) for t in pieces] + [have])
    dist.all_reduce(bucket, op=dist.ReduceOp.SUM, group=group)
    flags = bucket[-len(params) :].tolist()
    offset = 0
    for p, flag in zip(params, flags, strict=True):
        summed = bucket[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
        if p.grad is not None:
            p.grad.copy_(summed)
        elif flag > 0:
            p.grad = summed


class DataParallel:
    """This process's place in a `torch.distributed` process group (the default one
    unless `group` is given), as the engine uses it."""

    def __init__(self, *, rank: int, world_size: int, group: Any = None) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size}")
        self.rank = rank
        self.world_size = world_size
        self.group = group

    @classmethod
    def start(
        cls,
        *,
        rank: int,
        world_size: int,
        init_method: str,
        device: str,
        local_rank: int | None = None,
        timeout_s: float | None = None,
    ) -> DataParallel:
        """Join the default process group: NCCL when `device` is "cuda" (on GPU
        `local_rank`, by default `rank` modulo the GPUs this process sees), else gloo.
        `init_method`: "tcp://host:port" of rank 0, or "env://" (torchrun's variables).
        `timeout_s`: how long a collective may wait (torch's default when None)."""
        import datetime

        import torch
        import torch.distributed as dist

        if device == "cuda":
            gpu = rank % torch.cuda.device_count() if local_rank is None else local_rank
            torch.cuda.set_device(gpu)
            backend = "nccl"
        else:
            backend = "gloo"
        timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(
            backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout
        )
        return cls(rank=rank, world_size=world_size)

    def close(self) -> None:
        """Leave the process group (`start`'s)."""
        import torch.distributed as dist

        dist.destroy_process_group(self.group)

    @property
    def writes(self) -> bool:
        """Whether this rank writes adapters and checkpoints (rank 0 alone)."""
        return self.rank == 0

    def share(self, batches: Sequence[_Batch]) -> list[_Batch]:
        return share_micro_batches(batches, rank=self.rank, world_size=self.world_size)

    def all_reduce_gradients(self, params: Sequence[torch.Tensor]) -> None:
        all_reduce_gradients(params, self.group)

    def all_reduce_sums(self, values: Iterable[float]) -> list[float]:
        """The sums across ranks of `values` (float64), e.g. an update's metric sums."""
        import torch
        import torch.distributed as dist

        summed = torch.tensor(list(values), dtype=torch.float64, device=self._device())
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=self.group)
        return [float(v) for v in summed.tolist()]

    def agree(self, values: Iterable[int]) -> bool:
        """Whether every rank passed the same `values` (all ranks get the same answer)."""
        import torch
        import torch.distributed as dist

        mine = torch.tensor(list(values), dtype=torch.int64, device=self._device())
        both = torch.cat([mine, -mine])
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.group)
        n = mine.numel()
        # max over ranks == min over ranks, for every value
        return bool((both[:n] == -both[n:]).all())

    def _device(self) -> torch.device:
        import torch
        import torch.distributed as dist

        if dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
