"""Data parallelism of the learner (`learner.distributed`): 2 gloo ranks on CPU against one
process, on the tiny model and one M-GRPO update.

Every rank resumes the same checkpoint (v1, made here by one ordinary update, so the LoRA's
A and B are both non-zero and AdamW has moments), then updates on the same 5 groups with a
small micro-batch budget (several micro-batches each rank), server log-probs (ratios away
from 1, some tokens clipped), a KL term, and a grad-norm clip that acts. The one-process
reference makes the same update on its own copy of the checkpoint. The gradients of the
two are compared, and the adapters after the step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch
from peft import get_peft_model_state_dict
from safetensors.torch import load_file

from learner.batch import build_samples, micro_batches
from learner.checkpoint import Ledger, latest_checkpoint
from learner.distributed import assign_ranks, share_micro_batches
from learner.engine import Engine
from learner.loss import group_advantages
from runtime.base.config import LearnerConfig
from runtime.base.http import free_port
from runtime.base.messages import TrajectoryGroup, encode

MakeGroup = Callable[..., TrajectoryGroup]

WORKER = Path(__file__).with_name("distributed_worker.py")
WORLD = 2

CONFIG = LearnerConfig(
    batch_groups=5,
    lora_rank=4,
    lora_alpha=8,
    learning_rate=1e-2,
    optimizer_steps=2,
    micro_batch_tokens=48,
    grad_clip=0.05,
    clip_eps_low=0.02,
    clip_eps_high=0.02,
    kl_beta=0.1,
    recompute_logprobs=True,
    compute_dtype="float32",
    torch_threads=1,
)


def update_groups(make_group: MakeGroup) -> list[TrajectoryGroup]:
    rewards = [[1, 0, 0], [0, 1], [1, 1, 0, 0], [0, 0, 1], [1, 0]]
    return [
        make_group(10 + i, group_id=f"g{i}", rewards=r, vocab=500, version=1)
        for i, r in enumerate(rewards)
    ]


def cut(groups: list[TrajectoryGroup], budget: int) -> list[list[Any]]:
    advantages = [
        group_advantages(
            torch.tensor([t.reward for t in g.trajectories], dtype=torch.float64),
            eps=CONFIG.adv_eps,
        ).tolist()
        for g in groups
    ]
    return micro_batches(build_samples(groups, advantages), budget)


def key(sample: Any) -> tuple[str, str, int]:
    return (sample.group_id, sample.episode_id, sample.turn)


# --------------------------------------------------------------------------- sharing


def test_every_micro_batch_goes_to_one_rank_balanced_by_padded_tokens(
    make_group: MakeGroup,
) -> None:
    # largest first, each to the least loaded rank: 5->0, 4->1, 3->1, 3->0, 1->1
    assert assign_ranks([5, 4, 3, 3, 1], 2) == [0, 1, 1, 0, 1]
    assert assign_ranks([2, 2, 2], 1) == [0, 0, 0]
    batches = cut(update_groups(make_group), CONFIG.micro_batch_tokens)
    assert len(batches) >= 6
    costs = {id(b): len(b) * max(s.length for s in b) for b in batches}
    for world in (1, 2, 3, len(batches) + 2):
        shares = [share_micro_batches(batches, rank=r, world_size=world) for r in range(world)]
        dealt = sorted(id(b) for share in shares for b in share)
        assert dealt == sorted(id(b) for b in batches)  # each exactly once
        for share in shares:  # in the order given
            assert [batches.index(b) for b in share] == sorted(batches.index(b) for b in share)
        loads = [sum(costs[id(b)] for b in share) for share in shares]
        assert max(loads) - min(loads) <= max(costs.values())
        if world > len(batches):
            assert sum(1 for share in shares if not share) == world - len(batches)
    with pytest.raises(ValueError, match="rank 2"):
        share_micro_batches(batches, rank=2, world_size=2)


# --------------------------------------------------------------------------- 2 ranks


@dataclass(frozen=True, slots=True)
class Runs:
    batches: list[list[tuple[str, str, int]]]  # the update's micro-batches, as sample keys
    before: dict[str, torch.Tensor]  # the adapter of v1, where every run starts
    ranks: list[dict[str, Any]]  # what each worker saved
    ref_used: list[torch.Tensor]  # one process: the gradient the step used (clipped)
    ref_adapter: dict[str, torch.Tensor]
    ref_metrics: dict[str, float]
    folders: list[Path]  # each rank's learner folder


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, make_group: MakeGroup
) -> Iterator[Runs]:
    root = tmp_path_factory.mktemp("distributed")
    threads = torch.get_num_threads()  # the engines set torch_threads (1)
    start = Engine(CONFIG, base_model=tiny_model_dir, out_dir=root / "v1")
    start.open()
    warm = [make_group(1 + i, group_id=f"w{i}", rewards=[1, 0, 1], vocab=500) for i in range(2)]
    start.update(warm, Ledger())
    before = {k: v.clone() for k, v in get_peft_model_state_dict(start._model).items()}
    folders = [root / f"rank{r}" for r in range(WORLD)]
    for folder in [*folders, root / "ref"]:
        shutil.copytree(root / "v1", folder)

    groups = update_groups(make_group)
    groups_file = root / "groups.json"
    groups_file.write_bytes(encode(groups))
    init = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    results = [root / f"rank{r}.pt" for r in range(WORLD)]
    config = msgspec.json.encode(CONFIG).decode()
    procs: list[subprocess.Popen[bytes]] = []
    for r in range(WORLD):
        args = [tiny_model_dir, folders[r], groups_file, config, init, r, WORLD, results[r]]
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), *map(str, args)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
            )
        )
    try:
        # meanwhile, the same update in one process, without data parallelism
        ref = Engine(CONFIG, base_model=tiny_model_dir, out_dir=root / "ref")
        ref.open()
        ref_metrics = ref.update(groups, Ledger()).metrics
        params = [p for p in ref._model.parameters() if p.requires_grad]
        ref_used = [p.grad.detach().clone() for p in params if p.grad is not None]
        assert len(ref_used) == len(params)
        ref_adapter = {k: v.clone() for k, v in get_peft_model_state_dict(ref._model).items()}
        for proc in procs:
            output, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0, output.decode(errors="replace")[-4000:]
        yield Runs(
            batches=[[key(s) for s in b] for b in cut(groups, CONFIG.micro_batch_tokens)],
            before=before,
            ranks=[torch.load(path, weights_only=False) for path in results],
            ref_used=ref_used,
            ref_adapter=ref_adapter,
            ref_metrics=ref_metrics,
            folders=folders,
        )
    finally:
        torch.set_num_threads(threads)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def largest_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def scale(grads: list[torch.Tensor]) -> float:
    return max(float(g.abs().max()) for g in grads)


def test_the_ranks_share_the_micro_batches_and_each_trains_its_own(runs: Runs) -> None:
    shares = [rank["shares"] for rank in runs.ranks]
    assert all(len(share) == 1 for share in shares)  # one update
    mine = [share[0] for share in shares]
    assert all(len(m) >= 2 for m in mine)
    assert sorted(mb for m in mine for mb in m) == sorted(runs.batches)
    for rank in runs.ranks:
        assert rank["metrics"]["micro_batches"] == len(runs.batches)


def test_two_ranks_compute_the_one_process_gradient(runs: Runs) -> None:
    used = [rank["used"] for rank in runs.ranks]
    assert all(torch.equal(a, b) for a, b in zip(*used, strict=True))  # bit-identical ranks
    ref = runs.ref_used
    worst = largest_difference(used[0], ref)
    print(
        f"\nlargest |2-rank - 1-process| LoRA gradient difference: {worst:.3e} "
        f"(largest gradient entry {scale(ref):.3e}, {len(ref)} tensors)"
    )
    assert scale(ref) > 0
    # float32 sums of 9 micro-batches' gradients in another order: a few ulps of the largest
    # partial sums (measured 5.5e-7 of the largest entry); a lost or doubled micro-batch,
    # or a mean instead of a sum, is off by far more.
    for a, b in zip(used[0], ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * scale(ref))
    # the clip acted, on the norm of the whole gradient: equal in both
    for rank in runs.ranks:
        assert rank["metrics"]["grad_norm"] > CONFIG.grad_clip
        assert rank["metrics"]["grad_norm"] == pytest.approx(
            runs.ref_metrics["grad_norm"], rel=1e-5
        )


def test_without_the_all_reduce_each_rank_has_only_its_part(runs: Runs) -> None:
    local = [rank["local"][0] for rank in runs.ranks]
    summed = runs.ranks[0]["summed"][0]
    assert all(torch.equal(a, b) for a, b in zip(summed, runs.ranks[1]["summed"][0], strict=True))
    size = scale(summed)
    for mine in local:
        assert largest_difference(mine, summed) > 0.05 * size
    both = [a + b for a, b in zip(*local, strict=True)]
    assert largest_difference(both, summed) <= 1e-6 * size


def test_one_step_leaves_identical_adapters_equal_to_one_process(runs: Runs) -> None:
    first, second = (rank["adapter"] for rank in runs.ranks)
    assert first.keys() == second.keys() == runs.ref_adapter.keys()
    moved = max(float((first[k] - runs.before[k]).abs().max()) for k in first)
    assert moved > 0.5 * CONFIG.learning_rate  # AdamW steps ~lr: the adapter moved
    worst = 0.0
    for k, value in first.items():
        assert torch.equal(value, second[k]), k
        worst = max(worst, float((value - runs.ref_adapter[k]).abs().max()))
    print(f"\nlargest |2-rank - 1-process| adapter difference after the step: {worst:.3e}")
    assert worst <= 1e-3 * moved
    for name in ("loss", "clip_fraction", "approx_kl", "ratio_mean", "ref_kl", "samples"):
        assert runs.ranks[0]["metrics"][name] == pytest.approx(runs.ref_metrics[name], rel=1e-5)
    assert runs.ref_metrics["clip_fraction"] > 0


def test_rank_0_alone_writes_and_ranks_that_resumed_apart_refuse(runs: Runs) -> None:
    writer, other = runs.folders
    saved = latest_checkpoint(writer / "checkpoints")
    assert saved is not None and saved.state.version == runs.ranks[0]["version"] == 2
    weights = load_file(str(writer / "adapters" / "policy@v2" / "adapter_model.safetensors"))
    assert weights.keys() == runs.ranks[0]["adapter"].keys()
    for k, value in weights.items():
        assert torch.equal(value, runs.ranks[0]["adapter"][k])
    assert runs.ranks[1]["version"] == 2
    assert not (other / "adapters" / "policy@v2").exists()
    kept = latest_checkpoint(other / "checkpoints")
    assert kept is not None and kept.state.version == 1
    # opened again on their own folders, rank 0 finds v2 and rank 1 v1: both refuse
    assert "rank 0 opened v2" in runs.ranks[0]["refused"]
    assert "rank 1 opened v1" in runs.ranks[1]["refused"]


def test_a_gradient_no_rank_has_stays_missing(runs: Runs) -> None:
    for rank in runs.ranks:
        assert rank["only_rank0"] == [1.0, 2.0, 3.0]
        assert rank["nowhere"] is None
