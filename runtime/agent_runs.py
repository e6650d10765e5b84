"""Agent runs behind the endpoint: accept, execute, report, stream.

`RunService` owns a task group in which every accepted run executes; a
`CapacityLimiter` of `max_runs` decides at once whether a new run fits (else
`EndpointFull`, which the API answers with 429 and Retry-After). How a run executes is
the injected `RunExecutor` (the daemon's: one episode with its own BrowserContext and
host allowlist); this module only keeps the books and lets readers follow each run.
Each run executes in its own cancel scope, so `cancel(run_id)` ends that run alone (its
state becomes "cancelled"; the executor's own cleanup, e.g. closing the browser context,
runs as on any cancellation).
"""

from __future__ import annotations

import math
import statistics as stats
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any

import anyio
import msgspec
import structlog

from runtime.base.messages import RunRequest, RunState, RunTurn
from runtime.logs import bind_ids

__all__ = ["EndpointFull", "RunExecutor", "RunOutcome", "RunService", "UnknownRun"]

log = structlog.get_logger("runtime.agent_runs")

_ENDED = ("finished", "failed", "cancelled")


class EndpointFull(Exception):
    """No capacity for another run right now."""

    def __init__(self, max_runs: int, retry_after_s: int) -> None:
        super().__init__(f"all {max_runs} run slots are busy; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class UnknownRun(KeyError):
    """No run with that id (never created, or forgotten after `keep_finished` newer ones)."""

    def __str__(self) -> str:
        return f"no run {self.args[0]!r}"


class RunOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What an executed run ended with."""

    answer: str | None
    episode_status: str
    reward: float | None = None
    adapter: str | None = None


# (run id, request, report a turn) -> outcome
RunExecutor = Callable[[str, RunRequest, Callable[[RunTurn], None]], Awaitable[RunOutcome]]


class _Run:
    """Mutable book-keeping of one run; readers get frozen `RunState` snapshots."""

    def __init__(self, run_id: str, request: RunRequest) -> None:
        self.run_id = run_id
        self.request = request
        self.state = RunState(
            run_id=run_id, status="queued", intent=request.intent, created_at=time.time()
        )
        self.changed = anyio.Event()
        self.scope = anyio.CancelScope()
        self.ended = anyio.Event()  # set once the run has ended, however

    def update(self, **changes: Any) -> None:
        self.state = msgspec.structs.replace(self.state, **changes)
        self.changed.set()
        self.changed = anyio.Event()


class RunService:
    """Accepts runs up to `max_runs` at once and executes them in its own task group."""

    def __init__(
        self,
        executor: RunExecutor,
        *,
        max_runs: int,
        max_turns: int,
        keep_finished: int = 1000,
        validate: Callable[[RunRequest], None] | None = None,
    ) -> None:
        self._executor = executor
        self._validate = validate
        self._max_turns = max_turns
        self._limiter = anyio.CapacityLimiter(max_runs)
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self._keep_finished = keep_finished
        self._durations: deque[float] = deque(maxlen=50)
        self._counts = {
            "accepted": 0,
            "rejected_full": 0,
            "finished": 0,
            "failed": 0,
            "cancelled": 0,
        }
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> RunService:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        result = await self._tg.__aexit__(exc_type, exc, tb)
        self._tg = None
        return result

    def submit(self, request: RunRequest) -> RunState:
        """Accept `request` and start it, or raise `EndpointFull` / `ValueError`."""
        if self._tg is None:
            raise RuntimeError("RunService is not running (use `async with`)")
        if request.max_turns > self._max_turns:
            raise ValueError(f"max_turns must be at most {self._max_turns}")
        if self._validate is not None:
            self._validate(request)  # ValueError: a request this service cannot carry out
        run = _Run(uuid.uuid4().hex[:16], request)
        try:
            self._limiter.acquire_on_behalf_of_nowait(run)
        except anyio.WouldBlock:
            self._counts["rejected_full"] += 1
            raise EndpointFull(int(self._limiter.total_tokens), self._retry_after()) from None
        self._counts["accepted"] += 1
        self._runs[run.run_id] = run
        self._forget_old()
        self._tg.start_soon(self._execute, run)
        return run.state

    def get(self, run_id: str) -> RunState:
        run = self._runs.get(run_id)
        if run is None:
            raise UnknownRun(run_id)
        return run.state

    async def cancel(self, run_id: str) -> RunState:
        """Cancel the run (queued or running) and wait until it has ended; returns its final
        state. A run that has ended already is left as it is."""
        run = self._runs.get(run_id)
        if run is None:
            raise UnknownRun(run_id)
        if run.state.status in _ENDED:
            return run.state
        run.scope.cancel()
        await run.ended.wait()
        return run.state

    async def follow(self, run_id: str) -> AsyncIterator[RunTurn | RunState]:
        """Every turn of the run as it happens (earlier ones first), then its final state."""
        run = self._runs.get(run_id)
        if run is None:
            raise UnknownRun(run_id)
        sent = 0
        while True:
            changed = run.changed
            state = run.state
            for turn in state.turns[sent:]:
                yield turn
            sent = len(state.turns)
            if state.status in _ENDED:
                yield state
                return
            await changed.wait()

    def statistics(self) -> dict[str, Any]:
        return {
            **self._counts,
            "in_flight": int(self._limiter.borrowed_tokens),
            "max_runs": int(self._limiter.total_tokens),
            "median_run_s": stats.median(self._durations) if self._durations else None,
        }

    def prometheus(self) -> str:
        lines = [
            "# TYPE webagent_runs_total counter",
            *(f'webagent_runs_total{{outcome="{k}"}} {v}' for k, v in self._counts.items()),
            "# TYPE webagent_runs_in_flight gauge",
            f"webagent_runs_in_flight {int(self._limiter.borrowed_tokens)}",
        ]
        return "\n".join(lines) + "\n"

    async def _execute(self, run: _Run) -> None:
        started = time.monotonic()
        with bind_ids(run_id=run.run_id):
            try:
                run.update(status="running")

                def on_turn(turn: RunTurn) -> None:
                    run.update(turns=[*run.state.turns, turn])

                outcome: RunOutcome | None = None
                with run.scope:
                    outcome = await self._executor(run.run_id, run.request, on_turn)
                if outcome is None:  # cancel(): this run alone
                    self._counts["cancelled"] += 1
                    log.info("run.cancelled", turns=len(run.state.turns))
                    run.update(status="cancelled", error="cancelled", finished_at=time.time())
                    return
            except Exception as exc:
                self._counts["failed"] += 1
                log.warning("run.failed", error=repr(exc))
                run.update(
                    status="failed", error=str(exc) or type(exc).__name__, finished_at=time.time()
                )
            else:
                self._counts["finished"] += 1
                run.update(
                    status="finished",
                    answer=outcome.answer,
                    reward=outcome.reward,
                    episode_status=outcome.episode_status,
                    adapter=outcome.adapter,
                    finished_at=time.time(),
                )
                log.info(
                    "run.finished",
                    status=outcome.episode_status,
                    turns=len(run.state.turns),
                    reward=outcome.reward,
                )
            finally:
                if run.state.status == "running":  # cancelled: the service is shutting down
                    run.update(status="failed", error="interrupted", finished_at=time.time())
                self._durations.append(time.monotonic() - started)
                self._limiter.release_on_behalf_of(run)
                run.ended.set()

    def _retry_after(self) -> int:
        if not self._durations:
            return 5
        return max(1, math.ceil(stats.median(self._durations) / 2))

    def _forget_old(self) -> None:
        finished = [rid for rid, r in self._runs.items() if r.state.status in _ENDED]
        for rid in finished[: max(0, len(finished) - self._keep_finished)]:
            del self._runs[rid]
