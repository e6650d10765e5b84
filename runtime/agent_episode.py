"""How the agent endpoint executes one run: an episode like a rollout's.

`run_agent_episode` is the `RunExecutor` body the daemon hands to `runtime.agent_runs`:
the environment's episode setup gives the run what a rollout gets (on the built-in sites
its own tenant, by cookie), in a browser context of its own whose allowlist is the
request's start URL and `sites`; each turn is reported as a `RunTurn` as it is taken. A
request that names an adapter is answered by that version alone (`Pinned`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import msgspec

from runtime.actions import format_action
from runtime.agent_runs import RunOutcome
from runtime.base.messages import (
    EvalSpec,
    PolicyReply,
    PolicyRequest,
    RunRequest,
    RunTurn,
    TaskConfig,
    Turn,
)
from runtime.browser import BrowserPool
from runtime.environment import Environment
from runtime.episode import Episode, EpisodeSettings
from runtime.observation import TokenCounter
from runtime.protocols import Policy

__all__ = ["Pinned", "run_agent_episode"]


class Pinned:
    """A policy whose every request names one served adapter."""

    def __init__(self, policy: Policy, adapter: str) -> None:
        self.policy = policy
        self.adapter = adapter

    async def act(self, request: PolicyRequest) -> PolicyReply:
        return await self.policy.act(msgspec.structs.replace(request, adapter=self.adapter))


async def run_agent_episode(
    run_id: str,
    request: RunRequest,
    on_turn: Callable[[RunTurn], None],
    *,
    env: Environment,
    pool: BrowserPool,
    policy: Policy,
    settings: EpisodeSettings,
    count_tokens: TokenCounter,
) -> RunOutcome:
    """One agent run (see the module docstring); the request's max_turns replaces
    `settings.max_turns`."""
    task = TaskConfig(
        task_id=-1,
        intent=request.intent,
        start_url=request.start_url,
        eval=request.evaluation if request.evaluation is not None else EvalSpec(),
    )
    if request.adapter is not None:
        policy = Pinned(policy, request.adapter)
    settings = dataclasses.replace(settings, max_turns=request.max_turns)

    def report(turn: Turn) -> None:
        on_turn(
            RunTurn(
                index=turn.index,
                url=turn.url,
                thought=turn.thought,
                action=format_action(turn.action) if turn.action else "",
                error=turn.parse_error or turn.action_error,
            )
        )

    async with (
        env.episode(task) as setup,
        pool.session(allowed=[request.start_url, *request.sites], cookies=setup.cookies) as session,
    ):
        episode = Episode(
            episode_id=run_id,
            group_id="endpoint",
            task=setup.task,
            start_urls=setup.start_urls,
            urls=setup.urls,
            session=session,
            policy=policy,
            evaluate=env.evaluate if request.evaluation is not None else None,
            settings=settings,
            count_tokens=count_tokens,
            on_turn=report,
        )
        trajectory = await episode.run()
    adapters = sorted({t.adapter for t in trajectory.turns if t.adapter})
    return RunOutcome(
        answer=trajectory.answer,
        episode_status=trajectory.status,
        reward=trajectory.reward if request.evaluation is not None else None,
        adapter=adapters[-1] if adapters else None,
    )
