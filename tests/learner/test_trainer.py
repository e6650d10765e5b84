"""The learner loop on a tiny real model: staleness, zero variance, events, publishing."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import structlog
import torch
from structlog.testing import capture_logs

from learner.batch import build_samples, collate, policy_logprobs
from learner.checkpoint import latest_checkpoint
from learner.errors import BatchError, CheckpointError
from learner.lora import verify_adapter
from learner.trainer import Learner
from runtime.base.config import LearnerConfig
from runtime.base.messages import AdapterPublished, Event, TrajectoryGroup, UpdateApplied
from tests.learner.conftest import random_demos

MakeGroup = Callable[..., TrajectoryGroup]

CONFIG = LearnerConfig(
    batch_groups=2,
    lora_rank=4,
    lora_alpha=8,
    learning_rate=1e-2,
    optimizer_steps=1,
    micro_batch_tokens=64,
    # the update recomputes old log-probs (ratio 1 before the step; the groups here carry
    # made-up server log-probs)
    recompute_logprobs=True,
)


class Recorder:
    """The injected publisher and event sink: checks every manifest, records everything."""

    def __init__(self) -> None:
        self.published: list[Path] = []
        self.events: list[Event] = []

    async def publish(self, path: Path) -> None:
        verify_adapter(path)
        self.published.append(path)

    async def emit(self, event: Event) -> None:
        self.events.append(event)


def group(make_group: MakeGroup, seed: int, gid: str, rewards: Sequence[float], v: int) -> Any:
    return make_group(seed, group_id=gid, rewards=list(rewards), vocab=500, version=v)


async def feed(learner: Learner, groups: Sequence[TrajectoryGroup]) -> None:
    """Run the learner over `groups`; returns when it has consumed them and the stream closed."""
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](0)
    async with anyio.create_task_group() as tg, send:
        await tg.start(learner.run, receive)
        for g in groups:
            await send.send(g)


async def start_only(learner: Learner) -> None:
    """Run the learner on an already closed stream: open, resume, publish, return."""
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](0)
    send.close()
    await learner.run(receive)


@pytest.mark.anyio
async def test_updates_publish_versions_and_set_groups_aside(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    rec = Recorder()
    learner = Learner(
        msgspec.structs.replace(CONFIG, keep_adapters=1),  # raised to max_staleness + 2 = 3
        base_model=tiny_model_dir,
        out_dir=tmp_path,
        publish=rec.publish,
        emit=rec.emit,
    )
    g = {
        "a": group(make_group, 1, "a", [1, 0, 0], 0),
        "zero": group(make_group, 2, "zero", [1, 1], 0),
        "unversioned": group(make_group, 3, "unversioned", [1, 0], -1),
        "b": group(make_group, 4, "b", [0, 1], 0),
        # after v1: a v0 group is 1 behind (kept), then after v2 it is 2 behind (stale)
        "c": group(make_group, 5, "c", [0, 1, 1], 0),
        "d": group(make_group, 6, "d", [1, 0], 1),
        "old": group(make_group, 7, "old", [1, 0], 0),
        # as old, and with one reward: no signal, whatever its age
        "old_zero": group(make_group, 10, "old_zero", [0, 0], 0),
        "e": group(make_group, 8, "e", [1, 0], 2),
        "f": group(make_group, 9, "f", [0, 0, 1], 1),
    }
    order = ["a", "zero", "unversioned", "b", "c", "d", "old", "old_zero", "a", "e", "f"]
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        await feed(learner, [g[k] for k in order])
    assert [p.name for p in rec.published] == ["policy@v0", "policy@v1", "policy@v2", "policy@v3"]
    kinds = [type(e).__name__ for e in rec.events]
    assert kinds == ["AdapterPublished"] + ["UpdateApplied", "AdapterPublished"] * 3
    updates = [e for e in rec.events if isinstance(e, UpdateApplied)]
    assert [(u.version, u.groups_trained) for u in updates] == [(1, 2), (2, 2), (3, 2)]
    assert [(u.groups_stale, u.groups_zero_variance) for u in updates] == [(1, 1), (0, 0), (1, 1)]
    assert updates[0].metrics["zero_advantage_fraction"] == pytest.approx(1 / 3)
    for u in updates:
        for key in ("loss", "clip_fraction", "approx_kl", "ratio_mean", "grad_norm", "lr"):
            assert key in u.metrics
        # old logprobs recomputed by the learner, one optimizer step: ratio 1, nothing clipped
        assert u.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
        assert u.metrics["clip_fraction"] == 0.0
    published = [e for e in rec.events if isinstance(e, AdapterPublished)]
    assert [e.version for e in published] == [0, 1, 2, 3]
    stats = learner.statistics()
    assert (stats.version, stats.updates, stats.groups_trained) == (3, 3, 6)
    assert (stats.groups_stale, stats.groups_zero_variance, stats.groups_duplicate) == (2, 2, 1)
    assert stats.groups_received == len(order) and stats.groups_queued == 0
    # the checkpoint's ledger says who trained what
    saved = latest_checkpoint(tmp_path / "checkpoints")
    assert saved is not None and saved.state.version == 3
    assert saved.state.ledger.trained == {"a": 1, "b": 1, "c": 2, "d": 2, "e": 3, "f": 3}
    assert sorted(saved.state.ledger.stale) == ["old", "unversioned"]
    assert saved.state.ledger.zero_variance == ["zero", "old_zero"]
    # one canonical line per update, with the adapter bound
    lines = [entry for entry in logs if entry["event"] == "learner.update"]
    assert [(x["version"], x["adapter"], x["group_ids"]) for x in lines] == [
        (1, "policy@v1", ["a", "b"]),
        (2, "policy@v2", ["c", "d"]),
        (3, "policy@v3", ["e", "f"]),
    ]
    # published adapters on disk: the newest 3 (v0 went after v3 was published)
    kept = sorted(p.name for p in (tmp_path / "adapters").iterdir())
    assert kept == ["policy@v1", "policy@v2", "policy@v3"]
    # the journal holds every consumed id once (not the duplicate)
    journal = [json.loads(x)["id"] for x in (tmp_path / "consumed.jsonl").read_text().splitlines()]
    assert journal == ["a", "zero", "unversioned", "b", "c", "d", "old", "old_zero", "e", "f"]


def _logp_sums(model_dir: Path, adapter: Path | None, grp: TrajectoryGroup) -> list[float]:
    """Per-trajectory summed log-prob of its completions under base (+ adapter)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    samples = build_samples([grp], [[0.0] * len(grp.trajectories)])
    with torch.no_grad():
        lp = policy_logprobs(model, collate(samples, pad_id=0))
    k = lp.shape[1]
    sums: dict[str, float] = {}
    for row, s in enumerate(samples):
        sums[s.episode_id] = sums.get(s.episode_id, 0.0) + float(
            lp[row, k - len(s.completion_ids) :].sum()
        )
    return [sums[t.episode_id] for t in grp.trajectories]


@pytest.mark.anyio
async def test_an_update_moves_probability_towards_rewarded_trajectories(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    rec = Recorder()
    cfg = msgspec.structs.replace(CONFIG, batch_groups=1, optimizer_steps=4)
    learner = Learner(cfg, base_model=tiny_model_dir, out_dir=tmp_path, publish=rec.publish)
    grp = group(make_group, 11, "g", [1, 0, 0, 1], 0)
    before = _logp_sums(tiny_model_dir, rec.published[0] if rec.published else None, grp)
    await feed(learner, [grp])
    after = _logp_sums(tiny_model_dir, rec.published[-1], grp)
    delta = [a - b for a, b in zip(after, before, strict=True)]
    assert delta[0] > 0 and delta[3] > 0, delta
    assert delta[1] < 0 and delta[2] < 0, delta


@pytest.mark.anyio
async def test_learning_rate_zero_keeps_the_weights(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    rec = Recorder()
    cfg = msgspec.structs.replace(CONFIG, learning_rate=0.0, batch_groups=1)
    learner = Learner(cfg, base_model=tiny_model_dir, out_dir=tmp_path, publish=rec.publish)
    await feed(
        learner, [group(make_group, 1, "a", [1, 0], 0), group(make_group, 2, "b", [0, 1], 0)]
    )
    hashes = {verify_adapter(p).weights_sha256 for p in rec.published}
    assert len(rec.published) == 3 and len(hashes) == 1


def test_gradient_checkpointing_trains_the_same_adapter(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    from safetensors.torch import load_file

    from learner.checkpoint import Ledger
    from learner.engine import Engine

    groups = [group(make_group, 1, "a", [1, 0, 1], 0), group(make_group, 2, "b", [0, 1], 0)]
    weights = {}
    for checkpointing in (False, True):
        cfg = msgspec.structs.replace(CONFIG, gradient_checkpointing=checkpointing)
        engine = Engine(cfg, base_model=tiny_model_dir, out_dir=tmp_path / str(checkpointing))
        engine.open()
        layers = engine._model.get_base_model().model
        assert layers.gradient_checkpointing is checkpointing
        v0 = engine.adapter_path(0)
        result = engine.update(groups, Ledger())
        weights[checkpointing] = load_file(str(result.adapter_path / "adapter_model.safetensors"))
        first = load_file(str(v0 / "adapter_model.safetensors"))
        assert any(not torch.equal(first[k], w) for k, w in weights[checkpointing].items())
    for key, value in weights[False].items():
        torch.testing.assert_close(weights[True][key], value, rtol=0, atol=1e-6)


def test_minibatches_split_a_pass_into_steps_whose_mean_gradient_is_the_batchs(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    """At lr 0 (every step sees the same weights), the scaled gradients of a pass's two
    minibatch steps average to the one full-batch step's gradient; the loss is the same."""
    from learner.checkpoint import Ledger
    from learner.engine import Engine

    groups = [group(make_group, 1, "a", [1, 0, 1], 0), group(make_group, 2, "b", [0, 1], 0)]
    grads: dict[int, list[list[torch.Tensor]]] = {}
    results = {}
    for shares in (1, 2):
        cfg = msgspec.structs.replace(
            CONFIG, learning_rate=0.0, grad_clip=1e9, minibatches=shares, micro_batch_tokens=32
        )
        engine = Engine(cfg, base_model=tiny_model_dir, out_dir=tmp_path / str(shares))
        engine.open()
        params = [p for p in engine._model.parameters() if p.requires_grad]
        seen: list[list[torch.Tensor]] = []

        def record(*_: Any, _seen: Any = seen, _params: Any = params) -> None:
            _seen.append([p.grad.clone() for p in _params])

        engine._optimizer.register_step_pre_hook(record)
        results[shares] = engine.update(groups, Ledger())
        grads[shares] = seen
    assert len(grads[1]) == 1 and len(grads[2]) == 2
    assert results[1].step == 1 and results[2].step == 2
    assert results[2].metrics["micro_batches"] >= 2
    loss = results[1].metrics["loss"]
    assert results[2].metrics["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-7)
    # (LoRA's A matrices get no gradient while B is still zero.)
    assert any(not torch.equal(a, b) for a, b in zip(*grads[2], strict=True))
    for whole, first, second in zip(grads[1][0], *grads[2], strict=True):
        torch.testing.assert_close((first + second) / 2, whole, rtol=1e-4, atol=1e-7)


def test_the_bc_term_adds_its_coefficient_times_the_demonstrations_gradient(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    """At lr 0, a step's gradient with `bc_coef` c is the M-GRPO gradient plus c times the
    gradient of the drawn turns' mean NLL, and `bc_nll` is that NLL; the draw is fixed by
    seed and version."""

    from learner.bc_scoring import bc_samples, completion_logits
    from learner.checkpoint import Ledger
    from learner.engine import Engine
    from learner.loss import token_logprobs

    demos = random_demos(5, 12)
    groups = [group(make_group, 1, "a", [1, 0, 1], 0), group(make_group, 2, "b", [0, 1], 0)]
    grads: dict[float, list[torch.Tensor]] = {}
    metrics = {}
    for coef in (0.0, 0.5):
        cfg = msgspec.structs.replace(
            CONFIG, learning_rate=0.0, grad_clip=1e9, compute_dtype="float32", bc_coef=coef,
            bc_turns=4, bc_demos="demos.jsonl" if coef else "", micro_batch_tokens=32,
        )  # fmt: skip
        engine = Engine(cfg, base_model=tiny_model_dir, out_dir=tmp_path / str(coef), demos=demos)
        engine.open()
        params = [p for p in engine._model.parameters() if p.requires_grad]

        def record(*_: Any, _coef: float = coef, _params: Any = params) -> None:
            grads[_coef] = [p.grad.clone() for p in _params]

        engine._optimizer.register_step_pre_hook(record)
        metrics[coef] = engine.update(groups, Ledger()).metrics
    assert "bc_nll" not in metrics[0.0]
    drawn = engine.bc_draw(0)
    assert len(drawn) == 4 and drawn == engine.bc_draw(0) and drawn != engine.bc_draw(1)
    # The reference on the same (unchanged) weights: the drawn turns in one micro-batch.
    engine._optimizer.zero_grad(set_to_none=True)
    mb = collate(bc_samples(drawn, scoring=False), pad_id=0)
    nll = -(mb.weights * token_logprobs(completion_logits(engine._model, mb), mb.targets)).sum()
    nll.backward()
    reference = [p.grad.clone() for p in engine._model.parameters() if p.requires_grad]
    assert metrics[0.5]["bc_nll"] == pytest.approx(nll.item(), rel=1e-5)
    assert any(r.abs().sum() > 0 for r in reference)
    for with_bc, without, ref in zip(grads[0.5], grads[0.0], reference, strict=True):
        torch.testing.assert_close(with_bc, without + 0.5 * ref, rtol=1e-4, atol=1e-7)
    with pytest.raises(BatchError, match="bc_coef > 0 needs demonstrated turns"):
        Engine(cfg, base_model=tiny_model_dir, out_dir=tmp_path / "none")
    # "auto" (the default) with no demonstrations given: no term, no error.
    auto = msgspec.structs.replace(cfg, bc_demos="auto")
    assert Engine(auto, base_model=tiny_model_dir, out_dir=tmp_path / "auto").demos == []


def test_minibatch_shares_deal_every_micro_batch_once() -> None:
    from learner.batch import minibatch_shares

    assert minibatch_shares(5, 2) == [[0, 2, 4], [1, 3]]
    assert minibatch_shares(1, 3) == [[0], [], []]
    assert minibatch_shares(3, 0) == [[0, 1, 2]]


@pytest.mark.anyio
async def test_server_logprobs_and_kl_options(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    rec = Recorder()
    cfg = msgspec.structs.replace(
        CONFIG, recompute_logprobs=False, kl_beta=0.1, batch_groups=1, optimizer_steps=2
    )
    learner = Learner(
        cfg, base_model=tiny_model_dir, out_dir=tmp_path, publish=rec.publish, emit=rec.emit
    )
    await feed(
        learner, [group(make_group, 1, "a", [1, 0], 0), group(make_group, 2, "b", [0, 1], 0)]
    )
    first, second = [e for e in rec.events if isinstance(e, UpdateApplied)]
    # the fixture's "server" logprobs are random: ratios far from 1, many clipped
    assert abs(first.metrics["ratio_mean"] - 1.0) > 0.05
    assert first.metrics["clip_fraction"] > 0
    # KL to the base: 0 on the first step (v0 == base), positive once the adapter moved
    assert second.metrics["ref_kl"] > 0


@pytest.mark.anyio
async def test_torch_runs_off_the_event_loop(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    rec = Recorder()
    cfg = msgspec.structs.replace(CONFIG, batch_groups=2, optimizer_steps=8)
    learner = Learner(cfg, base_model=tiny_model_dir, out_dir=tmp_path, publish=rec.publish)
    groups = [
        make_group(s, group_id=f"g{s}", rewards=[1, 0, 1, 0], vocab=500, prompt_len=(60, 90))
        for s in range(2)
    ]
    gaps: list[float] = []
    busy_ticks = 0

    async def heartbeat() -> None:
        nonlocal busy_ticks
        last = time.perf_counter()
        while True:
            await anyio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
            busy_ticks += learner.statistics().updating

    async with anyio.create_task_group() as tg:
        tg.start_soon(heartbeat)
        await feed(learner, groups)
        tg.cancel_scope.cancel()
    assert learner.statistics().updates == 1
    assert learner.statistics().last_update_s > 0.2
    assert busy_ticks >= 10  # the loop kept running while torch worked
    # On the loop, the update's 8 optimizer steps would stall it for most of the update's
    # time. Bounded by a share of the update, not by seconds alone: on a loaded machine
    # (2 cores, a training run beside it) the OS alone left 0.27 s between two ticks while
    # the update took 3.7 s.
    assert max(gaps) < max(0.2, learner.statistics().last_update_s / 4)


@pytest.mark.anyio
async def test_restart_requeues_consumed_groups(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    groups = [group(make_group, s, f"g{s}", [1, 0], 0) for s in range(3)]
    first = Recorder()
    learner = Learner(CONFIG, base_model=tiny_model_dir, out_dir=tmp_path, publish=first.publish)
    await feed(learner, groups)  # g0, g1 trained (v1); g2 consumed, queued, stream closed
    assert learner.statistics().groups_queued == 1

    with pytest.raises(CheckpointError, match="no read_groups"):
        await start_only(
            Learner(CONFIG, base_model=tiny_model_dir, out_dir=tmp_path, publish=first.publish)
        )

    store = {g.group_id: g for g in groups}
    asked: list[list[str]] = []

    def read_groups(ids: Sequence[str]) -> list[TrajectoryGroup]:
        asked.append(list(ids))
        return [store[i] for i in ids if i in store]

    second = Recorder()
    again = Learner(
        CONFIG,
        base_model=tiny_model_dir,
        out_dir=tmp_path,
        publish=second.publish,
        read_groups=read_groups,
    )
    await feed(again, [groups[0], group(make_group, 9, "g9", [0, 1], 1)])
    assert asked == [["g2"]]
    assert [p.name for p in second.published] == ["policy@v1", "policy@v2"]  # republished v1
    stats = again.statistics()
    assert (stats.groups_resumed, stats.groups_duplicate, stats.version) == (1, 1, 2)
    saved = latest_checkpoint(tmp_path / "checkpoints")
    assert saved is not None
    assert saved.state.ledger.trained == {"g0": 1, "g1": 1, "g2": 2, "g9": 2}

    del store["g2"]  # a store that lost a consumed group is an error, not a silent loss
    with (tmp_path / "consumed.jsonl").open("a") as journal:
        journal.write('{"id":"g7"}\n')
    with pytest.raises(CheckpointError, match="missing from the trajectory store"):
        await start_only(
            Learner(
                CONFIG,
                base_model=tiny_model_dir,
                out_dir=tmp_path,
                publish=second.publish,
                read_groups=read_groups,
            )
        )


@pytest.mark.anyio
async def test_hold_starts_no_update_and_keeps_the_groups_for_a_restart(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    groups = [group(make_group, s, f"g{s}", [1, 0], 0) for s in range(4)]
    rec = Recorder()
    learner: Learner

    async def emit(event: Event) -> None:  # what the daemon's max_updates=1 does
        await rec.emit(event)
        if isinstance(event, UpdateApplied):
            learner.hold()

    learner = Learner(
        CONFIG, base_model=tiny_model_dir, out_dir=tmp_path, publish=rec.publish, emit=emit
    )
    await feed(learner, groups)  # g0, g1 trained (v1); g2, g3 arrive while held
    stats = learner.statistics()
    assert (stats.version, stats.updates, stats.groups_queued) == (1, 1, 2)
    journal = [json.loads(x)["id"] for x in (tmp_path / "consumed.jsonl").read_text().splitlines()]
    assert journal == ["g0", "g1", "g2", "g3"]

    store = {g.group_id: g for g in groups}
    again = Learner(
        CONFIG,
        base_model=tiny_model_dir,
        out_dir=tmp_path,
        publish=rec.publish,
        read_groups=lambda ids: [store[i] for i in ids],
    )
    await start_only(again)  # the held groups are re-read and trained first
    saved = latest_checkpoint(tmp_path / "checkpoints")
    assert saved is not None
    assert saved.state.ledger.trained == {"g0": 1, "g1": 1, "g2": 2, "g3": 2}


@pytest.mark.anyio
async def test_on_updating_spans_each_update_until_its_adapter_is_published(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    rec = Recorder()
    calls: list[tuple[bool, int]] = []  # (updating, adapters published at the call)
    learner = Learner(
        CONFIG,
        base_model=tiny_model_dir,
        out_dir=tmp_path,
        publish=rec.publish,
        on_updating=lambda updating: calls.append((updating, len(rec.published))),
    )
    await feed(learner, [group(make_group, s, f"g{s}", [1, 0], 0) for s in range(4)])
    # v0 published at start; each update: True before its adapter, False after it
    assert calls == [(True, 1), (False, 2), (True, 2), (False, 3)]


@pytest.mark.anyio
async def test_on_updating_is_released_when_an_update_fails(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    calls: list[bool] = []

    async def refuse(path: Path) -> None:
        if not path.name.endswith("@v0"):
            raise RuntimeError("the server refused the adapter")

    learner = Learner(
        CONFIG, base_model=tiny_model_dir, out_dir=tmp_path, publish=refuse,
        on_updating=calls.append,
    )  # fmt: skip
    with pytest.raises(BaseExceptionGroup) as raised:
        await feed(learner, [group(make_group, s, f"g{s}", [1, 0], 0) for s in range(2)])
    assert raised.group_contains(RuntimeError, match="refused", depth=None)
    assert calls == [True, False]


def _fail(grp: TrajectoryGroup, index: int, status: str) -> TrajectoryGroup:
    """`grp` with trajectory `index` ended by an infrastructure failure `status`."""
    trajs = list(grp.trajectories)
    trajs[index] = msgspec.structs.replace(trajs[index], status=status)
    return msgspec.structs.replace(grp, trajectories=trajs)


@pytest.mark.anyio
async def test_infrastructure_failures_are_dropped_before_advantages(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    rec = Recorder()
    learner = Learner(
        CONFIG, base_model=tiny_model_dir, out_dir=tmp_path, publish=rec.publish, emit=rec.emit
    )
    # "a": the failed trajectory has reward 0 next to a 1 and a 0: kept, it would change
    # every advantage. "lone": one evaluated trajectory left: no group to compare within.
    # "all_zero_once_dropped": [1 (interrupted), 0, 0] is zero-variance without the failure.
    a = _fail(group(make_group, 1, "a", [1, 0, 0], 0), 2, "error:browser")
    lone = _fail(group(make_group, 2, "lone", [1, 0], 0), 1, "interrupted")
    zero = _fail(group(make_group, 3, "all_zero_once_dropped", [1, 0, 0], 0), 0, "interrupted")
    b = group(make_group, 4, "b", [0, 1], 0)
    await feed(learner, [a, lone, zero, b])
    updates = [e for e in rec.events if isinstance(e, UpdateApplied)]
    assert len(updates) == 1
    update = updates[0]
    assert (update.groups_trained, update.groups_failed, update.groups_zero_variance) == (2, 1, 1)
    assert update.trajectories_dropped == 3
    # only the evaluated trajectories' turns were trained: one sample per turn
    kept_turns = sum(len(t.turns) for t in a.trajectories[:2]) + sum(
        len(t.turns) for t in b.trajectories
    )
    assert update.metrics["samples"] == kept_turns
    stats = learner.statistics()
    assert (stats.groups_failed, stats.trajectories_dropped) == (1, 3)
    saved = latest_checkpoint(tmp_path / "checkpoints")
    assert saved is not None
    assert saved.state.ledger.failed == ["lone"]
    assert saved.state.ledger.zero_variance == ["all_zero_once_dropped"]
    assert saved.state.ledger.trained == {"a": 1, "b": 1}


@pytest.mark.anyio
async def test_trajectories_with_an_unjudged_check_are_dropped(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    """An evaluation that left a check unjudged (no judge for a fuzzy match, an outcome
    reward model that said neither Yes nor No) has a reward of 0 that is not a failure."""
    from runtime.base.messages import EvalCheck, Evaluation

    rec = Recorder()
    learner = Learner(
        CONFIG, base_model=tiny_model_dir, out_dir=tmp_path, publish=rec.publish, emit=rec.emit
    )
    unjudged = Evaluation(reward=0.0, checks=[EvalCheck(kind="orm", passed=None)], unjudged=True)
    a = group(make_group, 1, "a", [1, 0, 0], 0)
    a = msgspec.structs.replace(
        a,
        trajectories=[
            *a.trajectories[:2],
            msgspec.structs.replace(a.trajectories[2], evaluation=unjudged),
        ],
    )
    b = group(make_group, 2, "b", [0, 1], 0)
    await feed(learner, [a, b])
    (update,) = [e for e in rec.events if isinstance(e, UpdateApplied)]
    assert update.trajectories_dropped == 1
    kept = [*a.trajectories[:2], *b.trajectories]
    assert update.metrics["samples"] == sum(len(t.turns) for t in kept)


def _published_version(rec: Recorder) -> int:
    """The version the server would serve now: the last one published."""
    return int(rec.published[-1].name.rsplit("@v", 1)[1])


@pytest.mark.anyio
@pytest.mark.parametrize("admission", [True, False])
async def test_groups_admitted_by_the_learner_are_never_stale(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup, admission: bool
) -> None:
    """A producer as fast as can be (groups made the moment they start, by the version
    published then, waiting in a stream for the learner): with `admits` as its gate none
    of 10 groups comes too late; without it, the learner sets most aside."""
    rec = Recorder()
    learner = Learner(CONFIG, base_model=tiny_model_dir, out_dir=tmp_path, publish=rec.publish)
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](16)
    held_back = 0
    async with anyio.create_task_group() as tg, send:
        await tg.start(learner.run, receive)
        for s in range(10):
            while admission and not learner.admits(s - learner.statistics().groups_received):
                held_back += 1
                await anyio.sleep(0.01)
            await send.send(group(make_group, s, f"g{s}", [1, 0], _published_version(rec)))
    stats = learner.statistics()
    if admission:
        assert held_back > 0
        assert (stats.groups_stale, stats.groups_trained) == (0, 10)
    else:
        assert stats.groups_stale >= 5


@pytest.mark.anyio
async def test_admits_counts_the_share_of_groups_the_learner_trains(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    rec = Recorder()
    learner = Learner(CONFIG, base_model=tiny_model_dir, out_dir=tmp_path, publish=rec.publish)
    # v0, nothing queued (2 a batch, 1 version of staleness): 3 ahead means one update
    # before the group arrives, 4 two
    await start_only(learner)
    assert [learner.admits(n) for n in (0, 3, 4)] == [True, True, False]
    # 3 groups with one reward (set aside, no update) and 1 mixed, queued: 2 of 5 so far
    # trained (with the one counted before any): 1 + 0.4 n < 4 up to n = 7
    zero = [group(make_group, s, f"z{s}", [1, 1], 0) for s in range(3)]
    await feed(learner, [*zero, group(make_group, 3, "m", [1, 0], 0)])
    assert learner.statistics().groups_queued == 1
    assert [learner.admits(n) for n in (7, 8)] == [True, False]


def test_an_update_follows_the_thread_count_it_is_told_between_forward_passes(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    """The daemon's hint (`Engine.threads`: all cores while no episode runs) takes effect
    at the next forward pass, in the thread the update runs in, not only at its start."""
    import threading

    from learner.checkpoint import Ledger
    from learner.engine import Engine

    engine = Engine(CONFIG, base_model=tiny_model_dir, out_dir=tmp_path)
    engine.open()
    asked: list[int] = []

    def threads() -> int:  # 2 for the first two calls, then 1 (episodes started)
        asked.append(2 if len(asked) < 2 else 1)
        return asked[-1]

    engine.threads = threads
    # registered after the engine's own hook: (what it was told, what it set)
    seen: list[tuple[int, int]] = []
    engine._model.register_forward_pre_hook(
        lambda *_: seen.append((asked[-1], torch.get_num_threads()))
    )
    groups = [group(make_group, s, f"g{s}", [1, 0, 1], 0) for s in range(4)]
    worker = threading.Thread(target=engine.update, args=(groups, Ledger()))
    worker.start()
    worker.join()
    assert len(seen) >= 4  # micro-batches of 64 tokens: several forward passes
    assert [set_ for told, set_ in seen] == [told for told, _ in seen]
    assert seen[0] == (2, 2) and seen[-1] == (1, 1)


def _guided(group: TrajectoryGroup) -> TrajectoryGroup:
    """`group` as a guided start: each episode begins with a turn the oracle played."""
    trajectories = []
    for trajectory in group.trajectories:
        oracle = msgspec.structs.replace(
            trajectory.turns[0], prompt_token_ids=[], completion_token_ids=[],
            completion_logprobs=[], adapter="", adapter_version=-1, text="oracle",
        )  # fmt: skip
        trajectories.append(msgspec.structs.replace(trajectory, turns=[oracle, *trajectory.turns]))
    return msgspec.structs.replace(group, trajectories=trajectories, guide=1)


@pytest.mark.anyio
async def test_a_guided_group_is_trained_on_the_policys_turns_not_set_aside_as_stale(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    rec = Recorder()
    learner = Learner(CONFIG, base_model=tiny_model_dir, out_dir=tmp_path,
                      publish=rec.publish, emit=rec.emit)  # fmt: skip
    guided = _guided(group(make_group, 1, "guided", [1, 0], 0))
    # The oracle's turns carry no version: only the policy's say how old a group is.
    all_oracle = _guided(group(make_group, 2, "all_oracle", [0, 1], 0))
    firsts = [msgspec.structs.replace(t, turns=t.turns[:1]) for t in all_oracle.trajectories]
    all_oracle = msgspec.structs.replace(all_oracle, trajectories=firsts)
    await feed(learner, [guided, all_oracle, group(make_group, 3, "plain", [0, 1], 0)])
    updates = [e for e in rec.events if isinstance(e, UpdateApplied)]
    assert [(u.groups_trained, u.groups_stale) for u in updates] == [(2, 1)]
    assert learner.statistics().groups_trained == 2
