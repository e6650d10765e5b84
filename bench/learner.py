"""Learner overhead: one M-GRPO update against a bare torch forward+backward, same tokens.

    .venv/bin/python -m bench.learner [--model DIR] [--threads 1] [--repeats 3]
                                      [--lora-layers N] [--recompute]
                                      [--compute-dtype auto]
                                      [--batch-groups 4] [--group-size 4] [--turns 4]
                                      [--prompt-tokens 600] [--completion-tokens 40]
                                      [--out bench/out]

One update batch: `--batch-groups` groups of `--group-size` trajectories of `--turns`
turns, each turn `--prompt-tokens` prompt ids and `--completion-tokens` completion ids
(random ids of the model's vocabulary, seeded; lengths jittered by +-25%), rewards half 1
and half 0 in every group so that every group carries signal.

- update: `learner.engine.Engine.update` on that batch (LoRA on the model; advantages,
  samples, micro-batches, old log-probs (the server's, or recomputed with `--recompute`),
  forward/backward through the M-GRPO loss, AdamW step, then the adapter saved and the
  checkpoint written), as the learner thread runs it; its own `train_s` and `save_s` are
  reported too;
- rerun: where LoRA leaves bottom layers frozen (`--lora-layers`), the same update with
  `learner.reuse_frozen` off: those layers run again in every forward (the reference and
  each optimizer pass) instead of once per micro-batch;
- bare: the same model with the same LoRA and AdamW, over the same padded micro-batch
  tensors: `model(input_ids, attention_mask)`, a weighted cross-entropy on the completion
  tokens, backward, optimizer step. Nothing else. A no-grad forward over the same tensors
  is timed too: the update's recomputation of old log-probs costs about that.
  Both run in the same precision (`--compute-dtype`, the learner's `compute_dtype`:
  bfloat16 autocast where the CPU multiplies bfloat16 natively), so that the ratio is the
  update's own overhead, not a difference of arithmetic.

Both run with `--threads` torch threads (set explicitly, reported), `--repeats` rounds
(update, bare, no-grad forward, interleaved so that all see the same load) after one
warm-up round; medians are reported with the overhead ratio update/bare. Uses
the tiny model (`webagent model init`, made once under `--out/cache`) unless `--model`.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import msgspec

from bench.common import (
    LoadSampler,
    finish,
    load_note,
    median,
    tiny_model,
)
from learner.batch import build_samples, collate, micro_batches
from learner.bc_scoring import bc_samples
from learner.checkpoint import Ledger
from learner.demos import BCExample
from learner.engine import Engine
from learner.loss import group_advantages
from learner.precision import compute_autocast
from runtime.base.config import LearnerConfig
from runtime.base.messages import Trajectory, TrajectoryGroup, Turn
from runtime.logs import configure_logging


def random_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    """About `n` (+-25%) random ids of the vocabulary, none of the first 3 (special)."""
    return [rng.randrange(3, vocab) for _ in range(max(1, round(n * rng.uniform(0.75, 1.25))))]


def make_groups(args: argparse.Namespace, vocab: int) -> list[TrajectoryGroup]:
    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return random_ids(rng, n, vocab)

    groups = []
    for g in range(args.batch_groups):
        trajectories = []
        for i in range(args.group_size):
            turns = []
            for k in range(args.turns):
                completion = ids(args.completion_tokens)
                turns.append(
                    Turn(
                        index=k,
                        url="",
                        observation="",
                        observation_digest="",
                        text="",
                        prompt_token_ids=ids(args.prompt_tokens),
                        completion_token_ids=completion,
                        completion_logprobs=[-1.0] * len(completion),
                        adapter="policy@v0",
                        adapter_version=0,
                    )
                )
            trajectories.append(
                Trajectory(
                    episode_id=f"g{g}-{i}",
                    group_id=f"g{g}",
                    task_id=g,
                    intent="",
                    turns=turns,
                    reward=float(i % 2),
                    status="exited",
                )
            )
        groups.append(
            TrajectoryGroup(group_id=f"g{g}", task_id=g, trajectories=trajectories, created_at=0.0)
        )
    return groups


def make_demos(args: argparse.Namespace, vocab: int) -> list[BCExample]:
    """`--bc-turns` demonstrated turns of random ids, sized as the groups' turns: the BC
    term's turns (every update draws all of them)."""
    rng = random.Random(1)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(random_ids(rng, n, vocab))

    demos = []
    for i in range(args.bc_turns):
        completion = ids(args.completion_tokens)
        demos.append(
            BCExample(
                task_id=i,
                episode_id=f"demo{i}",
                turn=0,
                prompt_ids=ids(args.prompt_tokens),
                completion_ids=completion,
                action_mask=(True,) * len(completion),
            )
        )
    return demos


def bare_setup(
    model_dir: Path,
    config: LearnerConfig,
    groups: list[TrajectoryGroup],
    demos: list[BCExample],
) -> Any:
    """The model with the same LoRA and AdamW, and the update's padded micro-batches (its
    groups', then its BC term's)."""
    import torch
    from transformers import AutoModelForCausalLM

    from learner.lora import attach_lora

    torch.manual_seed(config.seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    pad = base.config.pad_token_id if isinstance(base.config.pad_token_id, int) else 0
    model = attach_lora(base, config)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate)
    advantages = [
        group_advantages(
            torch.tensor([t.reward for t in g.trajectories], dtype=torch.float64),
            eps=config.adv_eps,
        )
        for g in groups
    ]
    samples = build_samples(groups, [a.tolist() for a in advantages])
    samples += bc_samples(demos, scoring=False)
    batches = [collate(mb, pad_id=pad) for mb in micro_batches(samples, config.micro_batch_tokens)]
    return model, optimizer, batches


def bare_step(model: Any, optimizer: Any, batches: list[Any], compute_dtype: str) -> None:
    import torch

    optimizer.zero_grad(set_to_none=True)
    for mb in batches:
        k = mb.completion_width
        with compute_autocast(compute_dtype, "cpu"):
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
        logits = logits[:, -k - 1 : -1, :]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), mb.targets.reshape(-1), reduction="none"
        )
        (loss * mb.weights.reshape(-1)).sum().backward()
    optimizer.step()


def no_grad_forward(model: Any, batches: list[Any], compute_dtype: str) -> None:
    """One forward pass without gradients: what recomputing old log-probs costs."""
    import torch

    model.eval()
    with torch.no_grad(), compute_autocast(compute_dtype, "cpu"):
        for mb in batches:
            model(input_ids=mb.input_ids, attention_mask=mb.attention_mask)
    model.train()


def run(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig

    torch.set_num_threads(args.threads)
    vocab = int(AutoConfig.from_pretrained(model_dir).vocab_size)
    groups = make_groups(args, vocab)
    demos = make_demos(args, vocab)
    config = LearnerConfig(
        device="cpu", torch_threads=args.threads, batch_groups=args.batch_groups,
        keep_checkpoints=1, lora_layers=args.lora_layers, recompute_logprobs=args.recompute,
        compute_dtype=args.compute_dtype, bc_coef=1.0 if demos else 0.0,
        bc_turns=max(1, len(demos)), bc_demos="bench" if demos else "",
    )  # fmt: skip
    update_s, train_s, save_s, bare_s, forward_s, rerun_s = [], [], [], [], [], []
    model, optimizer, batches = bare_setup(model_dir, config, groups, demos)
    with tempfile.TemporaryDirectory(prefix="bench-learner-") as tmp:
        engine = Engine(config, base_model=model_dir, out_dir=Path(tmp) / "reuse", demos=demos)
        engine.open()
        # The same update with the frozen bottom layers run again in every forward.
        rerun = None
        if engine._frozen:
            no_reuse = msgspec.structs.replace(config, reuse_frozen=False)
            rerun = Engine(no_reuse, base_model=model_dir, out_dir=Path(tmp) / "rerun", demos=demos)
            rerun.open()
        # Interleaved, so that all see the same load; the first round is a warm-up.
        for k in range(args.repeats + 1):
            t0 = time.perf_counter()
            result = engine.update(groups, Ledger())
            t1 = time.perf_counter()
            bare_step(model, optimizer, batches, config.compute_dtype)
            t2 = time.perf_counter()
            no_grad_forward(model, batches, config.compute_dtype)
            t3 = time.perf_counter()
            if rerun is not None:
                rerun.update(groups, Ledger())
            if k:
                update_s.append(t1 - t0)
                train_s.append(result.metrics["train_s"])
                save_s.append(result.metrics["save_s"])
                bare_s.append(t2 - t1)
                forward_s.append(t3 - t2)
                if rerun is not None:
                    rerun_s.append(time.perf_counter() - t3)
        metrics = result.metrics
        frozen = engine._frozen
    return {
        "threads": torch.get_num_threads(),
        "bfloat16": not isinstance(compute_autocast(config.compute_dtype, "cpu"), nullcontext),
        "interop_threads": torch.get_num_interop_threads(),
        "model": str(model_dir),
        "samples": int(metrics["samples"]),
        "trained_tokens": int(metrics["tokens"]),
        "micro_batches": int(metrics["micro_batches"]),
        "sample_tokens": sum(len(t.prompt_token_ids) + len(t.completion_token_ids)
                             for g in groups for tr in g.trajectories for t in tr.turns),
        "bc_turns": len(demos),
        "bc_tokens": sum(len(d.prompt_ids) + len(d.completion_ids) for d in demos),
        "padded_tokens": sum(int(mb.input_ids.numel()) for mb in batches),
        "bare_micro_batches": len(batches),
        "update_s": update_s,
        "train_s": train_s,
        "save_s": save_s,
        "bare_s": bare_s,
        "forward_s": forward_s,
        "frozen_layers": frozen,
        "rerun_s": rerun_s,
        "kl_beta": config.kl_beta,
        "optimizer_steps": config.optimizer_steps,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model folder (default: the tiny model)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=600)
    parser.add_argument("--completion-tokens", type=int, default=40)
    parser.add_argument(
        "--bc-turns", type=int, default=0,
        help="demonstrated turns of the BC term (learner.bc_coef 1, as the daemon's default "
        "with its demonstrations: 32), sized as the turns; the bare loop trains them too",
    )  # fmt: skip
    parser.add_argument(
        "--lora-layers", type=int, default=LearnerConfig().lora_layers,
        help="LoRA on the top N layers only (learner.lora_layers; 0: all)",
    )  # fmt: skip
    parser.add_argument(
        "--recompute", action="store_true",
        help="recompute old log-probs in the update (learner.recompute_logprobs)",
    )  # fmt: skip
    parser.add_argument(
        "--compute-dtype", choices=("auto", "float32", "bfloat16"),
        default=LearnerConfig().compute_dtype,
        help="precision of the matrix products, of the update and of the bare loop alike "
        "(learner.compute_dtype)",
    )  # fmt: skip
    parser.add_argument("--out", default="bench/out", help="folder for the JSON")
    args = parser.parse_args()
    configure_logging(level="warning")
    model = Path(args.model) if args.model else tiny_model(args.out)
    with LoadSampler(interval_s=2.0) as load:
        result = run(args, model)
    upd, trn, sav, bare, fwd = (
        median(result[k]) for k in ("update_s", "train_s", "save_s", "bare_s", "forward_s")
    )
    rows: list[list[object]] = [
        ["M-GRPO update (Engine.update)", upd * 1000, upd / bare],
    ]
    if result["rerun_s"]:
        rerun = median(result["rerun_s"])
        rows.append(
            [
                f"  the same, its {result['frozen_layers']} frozen layers rerun each forward",
                rerun * 1000,
                rerun / bare,
            ]
        )
    rows += [
        ["  of which training (train_s)", trn * 1000, trn / bare],
        ["  of which adapter + checkpoint (save_s)", sav * 1000, sav / bare],
        ["bare forward+backward+step", bare * 1000, 1.0],
        ["bare forward, no grad (the old log-probs' cost)", fwd * 1000, fwd / bare],
        ["bare step + no-grad forward", (bare + fwd) * 1000, (bare + fwd) / bare],
    ]
    table: dict[str, Any] = {
        "title": (
            f"one update: {result['samples']} turns, {result['sample_tokens']} tokens "
            + (
                f"+ the BC term's {result['bc_turns']} turns, {result['bc_tokens']} tokens "
                if result["bc_turns"]
                else ""
            )
            + f"({result['padded_tokens']} padded in {result['bare_micro_batches']} "
            f"micro-batches, the sampled turns' {result['micro_batches']}; "
            f"{result['trained_tokens']} trained), torch threads {result['threads']}, "
            f"medians of {args.repeats}"
        ),
        "headers": ["step", "ms", "x bare"],
        "rows": rows,
    }
    notes = [
        f"overhead ratio update/bare: {upd / bare:.2f} (training only: {trn / bare:.2f}); the "
        "update computes the M-GRPO loss"
        + (
            " and recomputes old log-probs (one more forward, no grad)"
            if args.recompute
            else " on the server's log-probs"
        )
        + ", the bare loop a plain cross-entropy; "
        f"update/(bare step + no-grad forward): {upd / (bare + fwd):.2f}",
        f"the update: {result['optimizer_steps']} optimizer passes over the batch"
        + (f", reference log-probs (kl_beta {result['kl_beta']})" if result["kl_beta"] else "")
        + (
            f"; its {result['frozen_layers']} layers below the LoRA run once per micro-batch "
            f"(learner.reuse_frozen): {median(result['rerun_s']) / upd:.2f}x faster than "
            "running them in every forward"
            if result["rerun_s"]
            else ""
        ),
        f"model {model.name}, LoRA rank {LearnerConfig().lora_rank} on all linear layers of "
        f"{'the top ' + str(args.lora_layers) if args.lora_layers else 'every'} layer(s), "
        f"{'bfloat16 autocast' if result['bfloat16'] else 'float32'} (update and bare alike; "
        f"compute_dtype {args.compute_dtype}), torch threads {result['threads']} "
        f"(interop {result['interop_threads']})",
        load_note(load),
    ]
    finish(args.out, "learner", result, table=table, notes=notes, load=load)


if __name__ == "__main__":
    main()
