"""The episode loop on local pages, with the real evaluators and real Chromium."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import pytest

from policy.prompt import COMPRESSED_OBSERVATION, build_messages
from runtime.base.config import ObservationConfig
from runtime.base.messages import (
    ElementQuery,
    EvalSpec,
    Event,
    OracleStep,
    PolicyReply,
    PolicyRequest,
    ProgramHtmlCheck,
    ReferenceAnswers,
    TaskConfig,
    Trajectory,
    Turn,
    TurnTaken,
)
from runtime.browser import BrowserPool
from runtime.environment import SitesEnvironment
from runtime.episode import Episode, EpisodeSettings, Gate
from runtime.oracle import OraclePolicy

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

FORM_TASK = TaskConfig(
    task_id=1,
    intent="Order a large blue item and say done.",
    start_url="__SHOPPING__/form",
    sites=["shopping"],
    eval=EvalSpec(
        eval_types=["string_match", "program_html"],
        reference_answers=ReferenceAnswers(exact_match="done"),
        program_html=[
            ProgramHtmlCheck(
                url="last",
                locator="document.querySelector('ul').innerText",
                required_contents={"must_include": ["q=blue", "size=Large"]},
            )
        ],
    ),
)

FORM_PLAN = [
    OracleStep(
        action="Type", target=ElementQuery(tag="input", attrs={"name": "q"}), argument="blue"
    ),
    OracleStep(
        action="Select Dropdown Option",
        target=ElementQuery(tag="select", attrs={"name": "size"}),
        argument="Large",
        thought="Pick the size.",
    ),
    OracleStep(action="Click", target=ElementQuery(tag="button", text="Send")),
    OracleStep(action="exit", message="done"),
]


class Recording:
    """Wraps a policy and keeps every request it saw."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.requests: list[PolicyRequest] = []

    async def act(self, request: PolicyRequest) -> PolicyReply:
        self.requests.append(request)
        reply: PolicyReply = await self.inner.act(request)
        return reply


class Scripted:
    """Replies with fixed completions, one per turn (the last one repeats)."""

    def __init__(self, texts: Sequence[str], *, fail_at: int | None = None) -> None:
        self.texts = list(texts)
        self.fail_at = fail_at
        self.observations: list[str] = []

    async def act(self, request: PolicyRequest) -> PolicyReply:
        self.observations.append(request.messages[-1].content)
        if request.turn == self.fail_at:
            raise ConnectionError("the server went away")
        return PolicyReply(
            text=self.texts[min(request.turn, len(self.texts) - 1)],
            prompt_token_ids=[1, 2, 3],
            completion_token_ids=[4, 5],
            completion_logprobs=[-0.5, -0.25],
            adapter="policy@v3",
            adapter_version=3,
        )


def _environment(web: Any) -> SitesEnvironment:
    return SitesEnvironment({"SHOPPING": web.url}, {"test": [FORM_TASK]})


async def _run(
    pool: BrowserPool,
    web: Any,
    policy: Any,
    *,
    task: TaskConfig = FORM_TASK,
    settings: EpisodeSettings | None = None,
    gate: Gate | None = None,
    started: Callable[[Episode], None] | None = None,
    on_event: Callable[[Event], None] | None = None,
    on_turn: Callable[[Turn], None] | None = None,
    evaluated: bool = True,
) -> Trajectory:
    environment = _environment(web)
    async with environment.episode(task) as setup, pool.session(allowed=setup.allowed) as session:
        episode = Episode(
            episode_id="e1",
            group_id="g1",
            task=setup.task,
            start_urls=setup.start_urls,
            urls=setup.urls,
            session=session,
            policy=policy,
            evaluate=environment.evaluate if evaluated else None,
            settings=settings or EpisodeSettings(max_turns=8),
            gate=gate,
            on_event=on_event,
            on_turn=on_turn,
        )
        if started is not None:
            started(episode)
        return await episode.run()


async def test_a_solved_episode_records_every_turn_exactly(pool: BrowserPool, web: Any) -> None:
    policy = Recording(OraclePolicy(lambda task: FORM_PLAN))
    trajectory = await _run(pool, web, policy)
    assert trajectory.status == "exited"
    assert trajectory.answer == "done"
    assert trajectory.reward == 1.0
    assert trajectory.evaluation is not None
    assert [c.passed for c in trajectory.evaluation.checks] == [True, True, True]
    assert len(trajectory.turns) == 4
    # The plan's thought, naming the element acted on as the page shows it, id included.
    thought = trajectory.turns[1].thought
    action = trajectory.turns[1].action
    assert action is not None and action.element is not None
    assert thought.startswith("Pick the size (select")
    assert thought.endswith(f" [{action.element}]).")
    assert trajectory.turns[-1].action is not None and trajectory.turns[-1].action.kind == "exit"
    assert trajectory.turns[-1].url.startswith(web("/result?q=blue"))
    # The messages sent are exactly those rebuilt from the recorded turns.
    for turn, request in zip(trajectory.turns, policy.requests, strict=True):
        history = [t.text for t in trajectory.turns[: turn.index]]
        assert request.messages == build_messages(trajectory.intent, history, turn.observation)
        assert turn.observation_digest and turn.timings.policy_s >= 0
    assert policy.requests[2].messages[1].content.endswith(COMPRESSED_OBSERVATION)
    assert trajectory.turns[0].observation in policy.requests[0].messages[-1].content


async def test_errors_are_shown_to_the_model_and_the_episode_goes_on(
    pool: BrowserPool, web: Any
) -> None:
    policy = Scripted(
        [
            '<think>a</think><answer>do(action="Click", element="99")</answer>',
            f'<think>b</think><answer>do(action="Goto", argument="{web.other}/elsewhere")</answer>',
            "I am not sure what to do",
            '<think>c</think><answer>exit(message="done")</answer>',
        ]
    )
    trajectory = await _run(pool, web, policy)
    assert trajectory.status == "exited"
    assert [t.action_error is not None for t in trajectory.turns] == [True, True, False, False]
    assert trajectory.turns[2].parse_error is not None
    assert "Error: there is no element 99" in policy.observations[1]
    assert "Error: Goto " in policy.observations[2] and "blocked" in policy.observations[2]
    assert "Error: no <answer>" in policy.observations[3]
    assert trajectory.reward == 0.0  # the form was never sent
    assert trajectory.adapter_versions == [3]
    assert trajectory.turns[0].completion_logprobs == [-0.5, -0.25]


@pytest.mark.parametrize(
    ("texts", "status", "turns"),
    [
        (["gibberish"], "parse_failures", 3),
        (['<answer>do(action="Scroll Up")</answer>'], "repeated_actions", 3),
        (
            ['<answer>do(action="Scroll Up")</answer>', '<answer>do(action="Wait")</answer>'] * 3,
            "max_turns",
            5,
        ),
    ],
)
async def test_endings(
    pool: BrowserPool, web: Any, texts: list[str], status: str, turns: int
) -> None:
    settings = EpisodeSettings(max_turns=5, max_parse_failures=3, max_repeats=3)
    trajectory = await _run(pool, web, Scripted(texts), settings=settings)
    assert trajectory.status == status
    assert len(trajectory.turns) == turns
    assert trajectory.evaluation is not None  # the policy's own endings are scored


async def test_a_failing_policy_ends_the_episode_with_its_turns(
    pool: BrowserPool, web: Any
) -> None:
    policy = Scripted(
        ['<answer>do(action="Wait")</answer>', "<answer>go_backward()</answer>"], fail_at=2
    )
    trajectory = await _run(pool, web, policy)
    assert trajectory.status == "error:policy"
    assert len(trajectory.turns) == 2
    assert trajectory.evaluation is None and trajectory.reward == 0.0


async def test_a_bug_inside_a_turn_ends_the_episode_with_its_turns(
    pool: BrowserPool, web: Any
) -> None:
    seen: list[Turn] = []

    def on_turn(turn: Turn) -> None:  # a hook that breaks on the second turn
        seen.append(turn)
        if turn.index == 1:
            raise KeyError("no such run")

    policy = Scripted(['<answer>do(action="Wait")</answer>', "<answer>go_backward()</answer>"])
    trajectory = await _run(pool, web, policy, on_turn=on_turn)
    assert trajectory.status == "error:runtime"
    assert [t.index for t in trajectory.turns] == [0, 1] == [t.index for t in seen]
    assert trajectory.evaluation is None and trajectory.reward == 0.0


async def test_a_start_url_outside_the_sites_is_a_task_error(pool: BrowserPool, web: Any) -> None:
    bad = TaskConfig(task_id=2, intent="x", start_url=f"{web.other}/elsewhere", sites=["shopping"])
    trajectory = await _run(pool, web, Scripted(["<answer>exit()</answer>"]), task=bad)
    assert trajectory.status == "error:task"
    assert trajectory.turns == []


async def test_a_closed_gate_holds_turns_and_interrupt_keeps_them(
    pool: BrowserPool, web: Any
) -> None:
    gate = Gate()
    gate.close()
    episodes: list[Episode] = []
    result: list[Trajectory] = []
    two_turns = anyio.Event()

    def on_event(event: Event) -> None:
        if isinstance(event, TurnTaken) and event.index == 1:
            two_turns.set()

    async def run() -> None:
        policy = Scripted(['<answer>do(action="Wait")</answer>'])
        result.append(
            await _run(pool, web, policy, gate=gate, started=episodes.append, on_event=on_event)
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        with anyio.fail_after(20):
            await gate.wait_held(1)
        assert episodes[0].turns == []
        gate.open()
        with anyio.fail_after(20):
            await two_turns.wait()
        episodes[0].interrupt()
    assert result[0].status == "interrupted"
    assert len(result[0].turns) >= 2
    assert result[0].evaluation is None


async def test_an_unevaluated_run_reports_turns_as_they_happen(pool: BrowserPool, web: Any) -> None:
    seen: list[Turn] = []
    policy = OraclePolicy(lambda task: FORM_PLAN)
    trajectory = await _run(pool, web, policy, on_turn=seen.append, evaluated=False)
    assert (trajectory.status, trajectory.evaluation, trajectory.reward) == ("exited", None, 0.0)
    assert seen == trajectory.turns and len(seen) == 4


def test_observation_settings_come_from_the_config() -> None:
    from runtime.base.config import Config, PolicyConfig, SchedulerConfig

    config = Config(
        scheduler=SchedulerConfig(max_turns=7, keep_thoughts=False),
        observation=ObservationConfig(style="compact"),
        policy=PolicyConfig(system_prompt="full"),
    )
    settings = EpisodeSettings.from_config(config, max_turns=3)
    assert settings.max_turns == 3
    assert settings.keep_thoughts is False  # not the default
    assert settings.observation.style == "compact"
