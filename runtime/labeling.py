"""Rewards from WebRL's outcome reward model, for tasks without an evaluator of their own.

A task whose `eval.eval_types` holds "orm" (a task a generator wrote, with no reference
answer or page check) is evaluated as usual, its "orm" check left `passed=None`
(`sites.evaluators.ORM_PENDING`). Once the group has finished, and before it is stored,
`OrmLabeler.label` asks the judge (`policy.orm.OrmJudge`: the task, the actions, the last
page) about each such episode and writes its verdict into that check; the reward is then
the product of the checks as the evaluators make it. A verdict that is neither Yes nor No,
or a judge that cannot be reached, leaves the check unjudged: reward 0, `unjudged`, and
so never trained on (`Trajectory.scored`), never a failure. A judge that leaves
`SILENT_JUDGE_EPISODES` episodes in a row unjudged is reported (a `Fault` of kind "judge",
and again every as many after): a judge that answers with the policy's first token instead
left every group of a WebRL run untrainable, and only info lines said so.

The judge is a LoRA on the served model (`sites.orm_judge`), loaded into the policy server
under `JUDGE_NAME`; `OrmJudgeAdapter.ensure` loads it again when the server has lost it
(a restarted server reloads only the policy's versions).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import structlog

from policy.client import CompletionClient
from policy.errors import PolicyError
from policy.orm import OrmJudge, Verdict, orm_inputs
from runtime.base.config import ConfigError
from runtime.base.messages import (
    EVALUATED_STATUSES,
    EvalCheck,
    Event,
    Fault,
    Trajectory,
    TrajectoryGroup,
)
from sites.evaluators import evaluation_of

__all__ = [
    "JUDGE_NAME",
    "SILENT_JUDGE_EPISODES",
    "OrmJudgeAdapter",
    "OrmLabeler",
    "check_judge",
    "judged",
]

log = structlog.get_logger("runtime.labeling")

JUDGE_NAME = "orm-judge"
ORM_CHECK = "orm"
# Episodes in a row left unjudged before the labeler reports a fault (four groups of 4).
SILENT_JUDGE_EPISODES = 16


def check_judge(folder: str | Path, served_model: str | None) -> None:
    """A ConfigError unless `folder` is a judge adapter from `webagent orm train` trained on
    `served_model` (the model the policy server serves; None: not known yet)."""
    config = Path(folder) / "adapter_config.json"
    try:
        base = json.loads(config.read_text())["base_model_name_or_path"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(
            "config", "sites.orm_judge", f"{folder} is not a judge adapter from `webagent orm "
            f"train` ({type(exc).__name__}: {exc})",
        ) from exc  # fmt: skip
    if served_model is not None and Path(base).resolve() != Path(served_model).resolve():
        raise ConfigError(
            "config", "sites.orm_judge", f"{folder} was trained on {base}, but the policy "
            f"server serves {served_model}: train the judge with --base {served_model}",
        )  # fmt: skip


class OrmJudgeAdapter:
    """The judge's LoRA folder, checked against the served model, loaded on demand."""

    def __init__(self, client: CompletionClient, folder: str | Path, *, served_model: str) -> None:
        check_judge(folder, served_model)
        self.client = client
        self.folder = Path(folder)

    async def ensure(self) -> None:
        """Load the judge into the server unless it lists it already."""
        if JUDGE_NAME not in await self.client.models():
            await self.client.load_adapter(JUDGE_NAME, str(self.folder))
            log.info("labeling.judge_loaded", folder=str(self.folder))


class OrmLabeler:
    """Judges the "orm" checks of finished groups."""

    def __init__(
        self,
        judge: OrmJudge,
        adapter: OrmJudgeAdapter | None = None,
        *,
        on_event: Callable[[Event], Awaitable[None]] | None = None,
    ) -> None:
        self.judge = judge
        self.adapter = adapter
        self.on_event = on_event
        self.judged = self.unjudged = 0
        self.unjudged_in_a_row = 0

    async def label(self, group: TrajectoryGroup) -> TrajectoryGroup:
        """The group with every pending "orm" check judged (others unchanged)."""
        pending = [i for i, t in enumerate(group.trajectories) if _pending(t)]
        if not pending:
            return group
        ready = True
        if self.adapter is not None:
            try:
                await self.adapter.ensure()
            except PolicyError as exc:
                ready = False
                log.warning("labeling.judge_unavailable", error=str(exc))
        trajectories = list(group.trajectories)
        for i in pending:
            verdict: Verdict | None = None
            detail = "the judge could not be loaded"
            if ready:
                try:
                    verdict = await self.judge.judge(*orm_inputs(trajectories[i]))
                except PolicyError as exc:
                    detail = f"the judge failed: {exc}"
                    log.warning("labeling.judge_failed", group_id=group.group_id, error=str(exc))
            trajectories[i] = judged(trajectories[i], verdict, detail)
            if trajectories[i].scored:
                self.judged += 1
                self.unjudged_in_a_row = 0
            else:
                self.unjudged += 1
                self.unjudged_in_a_row += 1
                if self.unjudged_in_a_row % SILENT_JUDGE_EPISODES == 0:
                    await self._silent()
        log.info(
            "labeling.group",
            group_id=group.group_id,
            judged=len(pending),
            rewards=[trajectories[i].reward for i in pending],
        )
        return msgspec.structs.replace(group, trajectories=trajectories)

    async def _silent(self) -> None:
        count = self.unjudged_in_a_row
        message = (
            f"the ORM judge left the last {count} episodes unjudged (no Yes or No among the "
            f"top {self.judge.k} first tokens, or no answer): their groups are not trained"
        )
        log.warning("labeling.judge_silent", episodes=count)
        if self.on_event is not None:
            await self.on_event(
                Fault(at=time.time(), kind="judge", message=message, where="runtime.labeling")
            )


def judged(trajectory: Trajectory, verdict: Verdict | None, detail: str = "") -> Trajectory:
    """`trajectory` with its pending "orm" check set from `verdict` (None, or a verdict
    with `success` None: left unjudged with `detail`), reward and `unjudged` recomputed as
    the evaluators do (1 only when every check passed)."""
    evaluation = trajectory.evaluation
    assert evaluation is not None
    passed = None if verdict is None else verdict.success
    if verdict is not None:
        detail = f"P(Yes) {verdict.p_yes:.3f}, P(No) {verdict.p_no:.3f}"
    checks = [
        EvalCheck(kind=c.kind, passed=passed, detail=detail) if _is_pending(c) else c
        for c in evaluation.checks
    ]
    scored = evaluation_of(checks)
    return msgspec.structs.replace(trajectory, reward=scored.reward, evaluation=scored)


def _is_pending(check: EvalCheck) -> bool:
    return check.kind == ORM_CHECK and check.passed is None


def _pending(trajectory: Trajectory) -> bool:
    evaluation = trajectory.evaluation
    return (
        trajectory.status in EVALUATED_STATUSES
        and evaluation is not None
        and any(_is_pending(c) for c in evaluation.checks)
    )
