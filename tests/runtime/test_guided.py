"""Guided starts: the oracle plays a task's first steps in real Chromium, the policy the rest."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from runtime.base.messages import (
    ChatMessage,
    ElementQuery,
    EvalSpec,
    OracleStep,
    PolicyReply,
    PolicyRequest,
    ReferenceAnswers,
    TaskConfig,
)
from runtime.browser import BrowserPool
from runtime.environment import SitesEnvironment
from runtime.episode import EpisodeSettings
from runtime.guided import GuidedPolicy, guide_of, guided_variants, steps_left
from runtime.oracle import OraclePolicy
from runtime.rollout import Rollout

TASK = TaskConfig(
    task_id=7,
    intent="Open the order form, then say ok.",
    start_url="__SHOPPING__/",
    sites=["shopping"],
    eval=EvalSpec(
        eval_types=["string_match"], reference_answers=ReferenceAnswers(exact_match="ok")
    ),
    intent_template_id=70,
)
PLAN = [
    OracleStep(action="Click", target=ElementQuery(tag="a", text="Form")),
    OracleStep(action="Scroll Down"),
    OracleStep(action="exit", message="ok"),
]


class Answering:
    """The policy after the hand-over: records what it was asked, answers `ok`."""

    def __init__(self) -> None:
        self.requests: list[PolicyRequest] = []

    async def act(self, request: PolicyRequest) -> PolicyReply:
        self.requests.append(request)
        return PolicyReply(
            text='<think>The form is open.</think><answer>exit(message="ok")</answer>',
            prompt_token_ids=[1, 2],
            completion_token_ids=[3],
            completion_logprobs=[-0.5],
            adapter_version=0,
        )


def _rollout(pool: BrowserPool, web: Any, policy: Any, oracle: OraclePolicy | None) -> Rollout:
    return Rollout(
        environment=SitesEnvironment({"SHOPPING": web.url}, {"train": [TASK]}),
        pool=pool,
        policy=policy,
        settings=EpisodeSettings(max_turns=6),
        oracle=oracle,
    )


@pytest.mark.anyio
@pytest.mark.browser
async def test_the_oracle_plays_the_first_steps_and_the_policy_goes_on_from_there(
    pool: BrowserPool, web: Any
) -> None:
    policy = Answering()
    rollout = _rollout(pool, web, policy, OraclePolicy(lambda task: PLAN))
    group = await rollout.run_group(msgspec.structs.replace(TASK, guide=1), group_size=2)
    assert group.guide == 1
    assert [t.reward for t in group.trajectories] == [1.0, 1.0]
    for trajectory in group.trajectories:
        oracle_turn, own_turn = trajectory.turns
        # The oracle's click: recorded, with no tokens for the learner to train.
        assert oracle_turn.action is not None and oracle_turn.action.name == "Click"
        assert (oracle_turn.completion_token_ids, oracle_turn.adapter_version) == ([], -1)
        assert own_turn.completion_token_ids == [3] and own_turn.url.endswith("/form")
    # The policy was asked from the second turn on, on the form, with the click in its history.
    assert sorted(r.turn for r in policy.requests) == [1, 1]
    for request in policy.requests:
        assert "Order form" in request.messages[-1].content
        assert any("Form" in m.content and m.role == "assistant" for m in request.messages[:-1])


@pytest.mark.anyio
@pytest.mark.browser
async def test_unshown_the_oracles_turns_leave_the_policy_a_fresh_start_on_their_page(
    pool: BrowserPool, web: Any
) -> None:
    policy = Answering()
    rollout = _rollout(pool, web, policy, OraclePolicy(lambda task: PLAN))
    rollout.guide_shown = False
    group = await rollout.run_group(msgspec.structs.replace(TASK, guide=1), group_size=1)
    assert [t.reward for t in group.trajectories] == [1.0]
    (request,) = policy.requests
    _system, first = request.messages  # no earlier round: round 0, on the form
    assert first.content.startswith(f"Task: {TASK.intent}\n\nRound 0\n")
    assert "Order form" in first.content and request.turn == 1


@pytest.mark.anyio
@pytest.mark.browser
async def test_a_rollout_without_an_oracle_refuses_a_guided_task(
    pool: BrowserPool, web: Any
) -> None:
    rollout = _rollout(pool, web, Answering(), None)
    with pytest.raises(ValueError, match=r"task 7 asks for a guided start \(guide=2\)"):
        await rollout.run_group(msgspec.structs.replace(TASK, guide=2), group_size=1)


def _request(turn: int) -> PolicyRequest:
    return PolicyRequest(
        episode_id="e", turn=turn, task=TASK, messages=[ChatMessage(role="user", content="page")]
    )


@pytest.mark.anyio
async def test_the_hand_over_counts_plan_steps_not_scrolls_and_happens_once() -> None:
    plan = [OracleStep(action="Scroll Down"), OracleStep(action="Wait"), *PLAN[1:]]
    oracle = OraclePolicy(lambda task: plan)
    policy = Answering()
    guided = GuidedPolicy(oracle, policy, steps=2)
    texts = [(await guided.act(_request(turn))).text for turn in range(4)]
    assert "Scroll Down" in texts[0] and "Wait" in texts[1]
    assert texts[2:] == ['<think>The form is open.</think><answer>exit(message="ok")</answer>'] * 2
    assert guided.handed_over_at == 2 and oracle.steps_done("e") == 0  # forgotten
    with pytest.raises(ValueError, match="at least one oracle step"):
        GuidedPolicy(oracle, policy, steps=0)


def test_variants_leave_the_policy_one_step_or_more_and_only_of_long_tasks() -> None:
    lengths = {1: 6, 2: 3, 3: None}
    tasks = [msgspec.structs.replace(TASK, task_id=i) for i in lengths]

    def length(task: TaskConfig) -> int | None:
        return lengths[task.task_id]

    variants = guided_variants(tasks, 3, length)
    assert [(v.task_id, guide_of(v)) for v in variants] == [(1, g) for g in range(1, 6)]
    assert [steps_left(length)(v) for v in variants] == [5, 4, 3, 2, 1]
    assert steps_left(length)(tasks[2]) is None and guide_of(tasks[0]) == 0
    assert guided_variants(tasks, 6, length) == [] and guided_variants(variants, 0, length) == []
