"""One episode: observe, ask the policy, parse, act, repeat; then the reward.

Each turn's messages are built only by `policy.prompt.build_messages` (earlier
observations compressed to `** Simplified html **`), and each `Turn` records the full
observation text and the raw completion, so the learner rebuilds exactly what was sent.

How an episode ends (`Trajectory.status`):

| status              | why                                                         | reward   |
|---------------------|-------------------------------------------------------------|----------|
| `exited`            | the policy called `exit(message=...)`                       | evaluated|
| `max_turns`         | `max_turns` turns without exit                              | evaluated|
| `parse_failures`    | `max_parse_failures` unparsable completions in a row        | evaluated|
| `repeated_actions`  | the same action on the same page `max_repeats` times in a row| evaluated|
| `interrupted`       | stopped from outside (scheduler stop, shutdown)             | 0        |
| `error:browser`     | Chromium or the episode's context died                      | 0        |
| `error:policy`      | the policy raised or timed out                              | 0        |
| `error:observation` | the page could not be observed in time                      | 0        |
| `error:evaluation`  | the evaluators raised or timed out                          | 0        |
| `error:task`        | a start URL outside the task's sites                        | 0        |
| `error:environment` | no tenant, or the start page did not load                   | 0        |
| `error:runtime`     | anything else raised in a turn (a bug; traceback logged)    | 0        |

The first four are the policy's doing (train on them); `interrupted` and `error:*` are
the infrastructure's (a learner should drop them). "Evaluated" statuses get the reward of
the task's evaluators on the final page, with the exit message as the answer (None when
the policy did not exit).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import anyio
import structlog

from policy.profile import unsettled
from policy.prompt import SYSTEM_PROMPT, build_messages, system_prompt
from runtime.actions import format_action, parse_completion, thought_of
from runtime.base.config import Config, ObservationConfig
from runtime.base.messages import (
    EVALUATED_STATUSES,
    Action,
    EpisodeFinished,
    EpisodeStarted,
    Evaluation,
    Event,
    PolicyReply,
    PolicyRequest,
    TaskConfig,
    Trajectory,
    Turn,
    TurnTaken,
    TurnTimings,
)
from runtime.errors import (
    ActionError,
    BrowserError,
    NavigationBlocked,
    ObservationError,
    ParseError,
)
from runtime.logs import bind_ids
from runtime.observation import TokenCounter, estimate_tokens
from runtime.protocols import Evaluator, Policy
from runtime.session import BrowserSession
from sites.errors import PageClosedError

__all__ = ["Episode", "EpisodeSettings", "Gate"]

log = structlog.get_logger("runtime.episode")


@dataclass(frozen=True, slots=True)
class EpisodeSettings:
    """What an episode needs from the configuration."""

    max_turns: int = 15
    max_parse_failures: int = 5
    max_repeats: int = 5
    keep_thoughts: bool = True
    observation: ObservationConfig = field(default_factory=lambda: ObservationConfig(style="html"))
    system_prompt: str = SYSTEM_PROMPT
    policy_timeout_s: float = 300.0
    eval_timeout_s: float = 60.0

    @classmethod
    def from_config(cls, config: Config, *, max_turns: int | None = None) -> EpisodeSettings:
        """The settings of `config`, whose "auto" choices the entry point has settled
        (`policy.profile.settle_auto`); one left "auto" is a ValueError naming it."""
        left = [name for name in unsettled(config) if name != "bc.prompt_loss"]
        if left:
            raise ValueError(
                f"{', '.join(left)} still 'auto': settle the config for its model first "
                "(policy.profile.settle_auto)"
            )
        s = config.scheduler
        return cls(
            max_turns=max_turns or s.max_turns,
            max_parse_failures=s.max_parse_failures,
            max_repeats=s.max_repeats,
            keep_thoughts=s.keep_thoughts,
            observation=config.observation,
            system_prompt=system_prompt(config.policy.system_prompt),
            policy_timeout_s=s.policy_timeout_s,
            eval_timeout_s=s.eval_timeout_s,
        )


class Gate:
    """Open, or closed for one or more reasons; episodes wait at it before each policy call.

    The control API closes it on pause (`Scheduler.pause`, reason "pause"); with
    `max_staleness` 0 the daemon also closes it while the learner updates
    (`Scheduler.hold_for_update`, reason "update": a turn made then would make its group
    stale). It opens once no reason is left. Waiting episodes stay in their turn (their
    browser context stays open) until it opens again or they are interrupted.
    `on_change(reasons)` sees every change (`runtime.cluster` passes it on to the workers'
    gates).
    """

    def __init__(self, on_change: Callable[[frozenset[str]], None] | None = None) -> None:
        self._opened = anyio.Event()
        self._opened.set()
        self._reasons: set[str] = set()
        self._arrived = anyio.Event()
        self._on_change = on_change
        self.waiting = 0

    @property
    def is_open(self) -> bool:
        return self._opened.is_set()

    @property
    def closed_for(self) -> frozenset[str]:
        """The reasons it is closed for (empty when open)."""
        return frozenset(self._reasons)

    def close(self, reason: str = "pause") -> None:
        self._reasons.add(reason)
        if self._opened.is_set():
            self._opened = anyio.Event()
        self._changed()

    def open(self, reason: str = "pause") -> None:
        """Take `reason` back; opens when it was the last one."""
        self._reasons.discard(reason)
        if not self._reasons:
            self._opened.set()
        self._changed()

    def open_all(self) -> None:
        self._reasons.clear()
        self._opened.set()
        self._changed()

    def set_reasons(self, reasons: Iterable[str]) -> None:
        """Closed for exactly `reasons` (open when empty): another gate's state, copied."""
        self._reasons = set(reasons)
        if not self._reasons:
            self._opened.set()
        elif self._opened.is_set():
            self._opened = anyio.Event()
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(frozenset(self._reasons))

    async def wait_open(self) -> None:
        while not self._opened.is_set():
            self.waiting += 1
            self._arrived.set()
            self._arrived = anyio.Event()
            try:
                await self._opened.wait()
            finally:
                self.waiting -= 1

    async def wait_held(self, count: int = 1) -> None:
        """Wait until at least `count` episodes wait at the (closed) gate."""
        while self.waiting < count:
            await self._arrived.wait()


class Episode:
    """One task in one browser session, driven by one policy.

    `run()` returns the `Trajectory` whatever happens; `interrupt()` (from another task)
    ends it with status `interrupted`, keeping the turns taken so far. `on_turn` sees
    each recorded turn as it happens (the agent endpoint streams them); `evaluate` None
    runs without a reward (an agent run that carries no evaluation).
    """

    def __init__(
        self,
        *,
        episode_id: str,
        group_id: str,
        task: TaskConfig,
        start_urls: Sequence[str],
        urls: Mapping[str, str],
        session: BrowserSession,
        policy: Policy,
        evaluate: Evaluator | None,
        settings: EpisodeSettings,
        count_tokens: TokenCounter = estimate_tokens,
        on_event: Callable[[Event], None] | None = None,
        on_turn: Callable[[Turn], None] | None = None,
        gate: Gate | None = None,
    ) -> None:
        self.on_turn = on_turn
        self.gate = gate if gate is not None else Gate()
        self.episode_id = episode_id
        self.group_id = group_id
        self.task = task
        self.start_urls = list(start_urls)
        self.urls = dict(urls)
        self.session = session
        self.policy = policy
        self.evaluate = evaluate
        self.settings = settings
        self.count_tokens = count_tokens
        self.on_event = on_event
        self.turns: list[Turn] = []
        self.status = ""
        self.answer: str | None = None
        self.error = ""
        self._scope = anyio.CancelScope()

    def interrupt(self) -> None:
        """End the episode now (status `interrupted`); safe to call at any time."""
        self._scope.cancel()

    def _emit(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)

    async def run(self) -> Trajectory:
        started = time.time()
        with bind_ids(
            episode_id=self.episode_id, group_id=self.group_id, task_id=self.task.task_id
        ):
            self._emit(
                EpisodeStarted(
                    at=started,
                    episode_id=self.episode_id,
                    group_id=self.group_id,
                    task_id=self.task.task_id,
                )
            )
            with self._scope:
                await self._loop()
            if self._scope.cancelled_caught:
                self.status = "interrupted"
            evaluation: Evaluation | None = None
            if self.status in EVALUATED_STATUSES and self.evaluate is not None:
                evaluation = await self._evaluate()
            trajectory = Trajectory(
                episode_id=self.episode_id,
                group_id=self.group_id,
                task_id=self.task.task_id,
                intent=self.task.intent,
                turns=list(self.turns),
                answer=self.answer,
                reward=evaluation.reward if evaluation is not None else 0.0,
                status=self.status,
                evaluation=evaluation,
                adapter_versions=sorted(
                    {t.adapter_version for t in self.turns if t.adapter_version >= 0}
                ),
                started_at=started,
                finished_at=time.time(),
            )
            self._emit(
                EpisodeFinished(
                    at=trajectory.finished_at,
                    episode_id=self.episode_id,
                    group_id=self.group_id,
                    task_id=self.task.task_id,
                    status=trajectory.status,
                    reward=trajectory.reward,
                    turns=len(trajectory.turns),
                    prompt_tokens=sum(len(t.prompt_token_ids) for t in trajectory.turns),
                    completion_tokens=sum(len(t.completion_token_ids) for t in trajectory.turns),
                )
            )
            log.info(
                "episode.finished",
                status=trajectory.status,
                reward=trajectory.reward,
                turns=len(trajectory.turns),
                seconds=round(trajectory.finished_at - started, 3),
                error=self.error or None,
            )
            return trajectory

    async def _loop(self) -> None:
        settings = self.settings
        history: list[str] = []
        error: str | None = None
        parse_failures = 0
        repeats = 0
        last_key: tuple[str, str] | None = None
        try:
            try:
                await self.session.open(self.start_urls)
            except NavigationBlocked as exc:  # a start URL outside the allowlist
                self._fail("error:task", exc)
                return
            except ActionError as exc:  # a start page that does not load
                self._fail("error:environment", exc)
                return
            for index in range(settings.max_turns):
                t0 = time.perf_counter()
                observation = await self.session.observe(
                    settings.observation, error=error, count_tokens=self.count_tokens
                )
                messages = build_messages(
                    self.task.intent,
                    history,
                    observation.text,
                    keep_thoughts=settings.keep_thoughts,
                    system_prompt=settings.system_prompt,
                )
                request = PolicyRequest(
                    episode_id=self.episode_id, turn=index, task=self.task, messages=messages
                )
                await self.gate.wait_open()
                t1 = time.perf_counter()
                reply = await self._act(request)
                t2 = time.perf_counter()
                action: Action | None = None
                parse_error: str | None = None
                action_error: str | None = None
                try:
                    completion = parse_completion(reply.text)
                    action = completion.action
                    thought = completion.thought
                except ParseError as exc:
                    parse_error = str(exc)
                    thought = thought_of(reply.text)
                if action is not None and action.kind != "exit":
                    try:
                        await self.session.execute(action)
                    except ActionError as exc:
                        action_error = str(exc)
                t3 = time.perf_counter()
                self.turns.append(
                    Turn(
                        index=index,
                        url=observation.url,
                        observation=observation.text,
                        observation_digest=observation.digest,
                        text=reply.text,
                        thought=thought,
                        action=action,
                        parse_error=parse_error,
                        action_error=action_error,
                        prompt_token_ids=reply.prompt_token_ids,
                        completion_token_ids=reply.completion_token_ids,
                        completion_logprobs=reply.completion_logprobs,
                        adapter=reply.adapter,
                        adapter_version=reply.adapter_version,
                        timings=TurnTimings(observe_s=t1 - t0, policy_s=t2 - t1, act_s=t3 - t2),
                    )
                )
                if self.on_turn is not None:
                    self.on_turn(self.turns[-1])
                self._emit(
                    TurnTaken(
                        at=time.time(),
                        episode_id=self.episode_id,
                        index=index,
                        action=format_action(action) if action is not None else "",
                        adapter=reply.adapter,
                        error=parse_error or action_error,
                    )
                )
                history.append(reply.text)
                error = parse_error or action_error
                if action is not None and action.kind == "exit":
                    self.answer = action.message or ""
                    self.status = "exited"
                    return
                parse_failures = parse_failures + 1 if action is None else 0
                if parse_failures >= settings.max_parse_failures:
                    self.status = "parse_failures"
                    return
                key = (format_action(action), observation.digest) if action else None
                repeats = repeats + 1 if key is not None and key == last_key else 1
                last_key = key
                if key is not None and repeats >= settings.max_repeats:
                    self.status = "repeated_actions"
                    return
            self.status = "max_turns"
        except BrowserError as exc:
            self._fail("error:browser", exc)
        except ObservationError as exc:
            self._fail("error:observation", exc)
        except _PolicyFailed as exc:
            self._fail("error:policy", exc.__cause__ or exc)
        except Exception as exc:  # a bug in a turn must not lose the turns before it
            log.exception("episode.runtime_failed")
            self._fail("error:runtime", exc)

    def _fail(self, status: str, exc: BaseException) -> None:
        self.status = status
        self.error = f"{type(exc).__name__}: {exc}"

    async def _act(self, request: PolicyRequest) -> PolicyReply:
        try:
            with anyio.fail_after(self.settings.policy_timeout_s):
                return await self.policy.act(request)
        except Exception as exc:  # any failure of the policy ends the episode
            raise _PolicyFailed(str(exc)) from exc

    async def _evaluate(self) -> Evaluation | None:
        if self.evaluate is None:
            return None
        try:
            page = self.session.page
            with anyio.fail_after(self.settings.eval_timeout_s):
                return await self.evaluate(self.task, answer=self.answer, page=page, urls=self.urls)
        except (BrowserError, PageClosedError) as exc:
            self._fail("error:browser", exc)
        except Exception as exc:  # an evaluator bug must not lose the trajectory
            log.warning("episode.evaluation_failed", error=f"{type(exc).__name__}: {exc}")
            self._fail("error:evaluation", exc)
        return None


class _PolicyFailed(Exception):
    """Internal: the policy raised (the cause) or timed out."""
