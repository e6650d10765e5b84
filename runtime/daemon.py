"""The daemon behind `webagent train` and `webagent serve`: one process, one event loop.

    sites (built-in, in-process; or WebArena) ─┐
    browser pool (one Chromium) ───────────────┼─> scheduler ─> groups ─> pump ─┬─> store (fsync)
    vLLM (child process or external) <─ policy ┘                                └─> learner
          ^                                                                        (worker thread)
          └──────── hot-swap of each new adapter version (policy.adapters) <──────────┘
    control API + agent endpoint (in-process ASGI) ── status, metrics, pause, runs
    evaluations every `eval_every` updates on the test and ood splits (greedy by default:
    `daemon.eval_temperature`)

Order of work on start: run directory (effective config), environment, model (the
embedded default's bootstrap when `policy.model` is empty), vLLM and the adapter
manager, the learner (which resumes from its newest checkpoint and publishes its
version), then rollouts. Every finished group is stored (fsynced) before the learner
sees it, so a restart re-reads what the learner had consumed but not trained.

Stopping (`stop()`: SIGINT, SIGTERM, `max_updates`, or a caller): no new groups; groups
in flight finish, or after `drain_timeout_s` are recorded with their episodes
`interrupted`; they are stored and journaled by the learner, which starts no further
update (so `max_updates=N` makes exactly N) but finishes one in progress (checkpoint
included) and returns (only then is the rest cancelled); the drained groups are trained
after a restart; the API stops; vLLM is stopped with its process group. Running the same
command again resumes, and first hands the learner any stored group it never journaled.

The policy server is supervised (`runtime.supervisor`): while it is down new turns wait,
a launched one is restarted with its adapters, an external one awaited; `Fault` events.

The daemon is wiring: the parts live in their modules (`runtime.training` the scheduler,
store pump and learner; `runtime.evaluation.PeriodicEvaluations`; `runtime.api.serve_api`
the HTTP face; `runtime.metrics` the books and the curve; `policy.adapters` hot reload).
"""

from __future__ import annotations

import functools
import signal
import time
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any, Protocol

import anyio
import httpx
import msgspec
import structlog
from anyio.abc import TaskStatus

from policy.adapters import publish_new_folders
from policy.profile import settle_auto
from policy.replicas import ReplicaSet
from runtime.api import serve_api
from runtime.base.config import Config, dump_config
from runtime.base.files import write_atomic
from runtime.base.messages import EvalFinished, Event, UpdateApplied
from runtime.bootstrap import (
    BootstrapProgress,
    bc_term_of,
    prepare_model,
    served_model,
    zero_adapter_of,
)
from runtime.browser import BrowserPool
from runtime.environment import Environment
from runtime.evaluation import PeriodicEvaluations
from runtime.guard import endpoint_token
from runtime.metrics import CurvePlotter, MetricsBook
from runtime.policystack import PolicyStack, policy_stack
from runtime.scheduler import Scheduler
from runtime.supervisor import ServerSupervisor
from runtime.training import Training
from runtime.webarena_environment import open_environment
from sites.judge import HttpJudge

__all__ = ["Daemon"]


class _Reporting(Protocol):
    def statistics(self) -> object: ...


log = structlog.get_logger("runtime.daemon")


class Daemon:
    """Training (rollouts + learner), serving (control API + agent endpoint), or both."""

    def __init__(
        self,
        config: Config,
        *,
        training: bool = True,
        api: bool = True,
        url_overrides: Mapping[str, str] | None = None,
        judge_key: str = "",
        api_token: str | None = None,
        generator_key: str = "",
    ) -> None:
        # Pages and prompt as the served model reads them (the embedded default's when
        # policy.model is empty: the first run makes that model, BC included).
        self.config = config = settle_auto(config)
        self.judge_key = judge_key  # the API key of `sites.judge_url` (never logged)
        self.generator_key = generator_key  # of `webrl.generator_url` (never logged)
        self._http: httpx.AsyncClient | None = None  # for chat models (judge, generator)
        self.api_token = api_token  # None: resolved from [endpoint] (runtime.guard)
        self.training = training and config.learner.enabled
        self.api = api and config.endpoint.enabled
        self.url_overrides = dict(url_overrides or {})
        self.run_dir = Path(config.daemon.run_dir)
        self.book = MetricsBook()
        self.model = ""
        self.api_url = ""
        self.started_at = time.time()
        self._bootstrap = BootstrapProgress()  # the first run's model-making stages
        self._stop = anyio.Event()
        self._stopped_by = ""
        self._plotter = CurvePlotter(self.run_dir)
        self._evaluations: PeriodicEvaluations | None = None
        self._pool: BrowserPool | None = None
        self._environment: Environment | None = None
        self._stack: PolicyStack | None = None
        self._supervisor: ServerSupervisor | None = None
        self._training: Training | None = None
        self._updates = 0

    # ------------------------------------------------------------------ control

    def stop(self, reason: str = "requested") -> None:
        """Begin a graceful stop (idempotent)."""
        if not self._stop.is_set():
            self._stopped_by = reason
            log.info("daemon.stopping", reason=reason)
            if self._training is not None:
                self._training.hold()  # groups from the drain are trained after a restart
            self._stop.set()

    async def pause(self) -> None:
        if self._scheduler is not None:
            self._scheduler.pause()

    async def resume(self) -> None:
        if self._scheduler is not None:
            self._scheduler.resume()

    async def load_policy(self, path: str) -> str:
        """Serve an adapter trained elsewhere (training must be off: the learner owns the
        version sequence while it runs)."""
        if self.training:
            raise ValueError(
                "training is on: the learner publishes every version; load policies into a "
                "daemon with [learner] enabled = false"
            )
        if self._stack is None:
            raise ValueError("the policy server is not up yet")
        result = await self._stack.adapters.publish(path)
        return str(result.name)

    @property
    def _scheduler(self) -> Scheduler | None:
        return None if self._training is None else self._training.scheduler

    # ------------------------------------------------------------------ books

    def record(self, event: Event) -> None:
        self.book.record(event)
        if isinstance(event, EvalFinished):
            self._plotter.want()
        if isinstance(event, UpdateApplied):
            self._updates += 1
            self._plotter.want()
            every = self.config.daemon.eval_every
            if every and self._updates % every == 0 and self._evaluations is not None:
                self._evaluations.want(self._updates)
            limit = self.config.daemon.max_updates
            if limit and self._updates >= limit:
                self.stop(f"max_updates={limit} reached")

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": "training" if self.training else "serving",
            "model": self.model,
            "stage": "running" if self.model else self._bootstrap.describe() or "starting",
            "uptime_s": round(time.time() - self.started_at, 1),
            "stopping": self._stop.is_set(),
            **self.book.summary(),
        }
        parts: dict[str, _Reporting | None] = {
            "server": self._supervisor,
            "scheduler": self._scheduler,
            "learner": None if self._training is None else self._training.learner,
            "browser": self._pool,
        }
        if self._environment is not None:
            out["sites"] = dict(self._environment.urls)
        if self._stack is not None:
            parts |= {"adapters": self._stack.adapters, "policy": self._stack.policy}
            if isinstance(self._stack.client, ReplicaSet):
                out["replicas"] = msgspec.to_builtins(self._stack.client.statistics())
        for name, part in parts.items():
            if part is not None:
                out[name] = msgspec.to_builtins(part.statistics())
        return out

    def prometheus(self) -> str:
        return self.book.prometheus(
            server=self._supervisor.statistics() if self._supervisor is not None else None,
            scheduler=self._scheduler.statistics() if self._scheduler is not None else None,
        )

    # ------------------------------------------------------------------ running

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until stopped; `task_status.started()` once rollouts (or the API) run."""
        config = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.run_dir / "config.toml", dump_config(config).encode())
        self.book = MetricsBook(self.run_dir / "metrics.jsonl")
        log.info("daemon.starting", run_dir=str(self.run_dir), training=self.training, api=self.api)
        denied = [(config.endpoint.host, config.endpoint.port)] if config.endpoint.port else []
        try:
            async with (
                anyio.create_task_group() as outer,
                BrowserPool(config.browser, denied=denied, on_event=self.record) as pool,
                httpx.AsyncClient() as judge_http,
                open_environment(
                    config,
                    url_overrides=self.url_overrides,
                    browser=pool,
                    judge=HttpJudge.from_config(config.sites, judge_http, api_key=self.judge_key),
                ) as env,
            ):
                outer.start_soon(self._signals)
                self._pool, self._environment, self._http = pool, env, judge_http
                await self._run_with(env, pool, task_status)
                outer.cancel_scope.cancel()
        finally:
            self.book.close()
            log.info("daemon.stopped", reason=self._stopped_by or "error", updates=self._updates)

    async def _run_with(
        self, env: Environment, pool: BrowserPool, task_status: TaskStatus[None]
    ) -> None:
        config = self.config
        first: Path | None = None  # training: the learner publishes its first version
        if self.training:
            self.model = await self._unless_stopped(
                prepare_model(config, env, progress=self._bootstrap)
            )
            if self._stop.is_set():  # stopped while the first run made its model
                task_status.started()
                return
        else:
            self.model = served_model(config)
            first = await zero_adapter_of(config, self.model)
        if self.training:
            config = bc_term_of(config)  # before policy.model names the served model
        served = msgspec.structs.replace(
            config, policy=msgspec.structs.replace(config.policy, model=self.model)
        )
        self.config = served  # episodes' settings follow the served model's profile
        async with policy_stack(
            served, adapter=first, log_path=self.run_dir / "vllm.log", on_event=self.record
        ) as stack:
            self._stack = stack
            for url in stack.urls:
                pool.deny(url)  # no page may reach a policy server
            self._supervisor = supervisor = ServerSupervisor(
                served.policy,
                server=stack.server,
                client=stack.client,
                adapters=stack.adapters,
                on_down=lambda reason: self._hold_for_policy(True),
                on_up=lambda: self._hold_for_policy(False),
                on_event=self.record,
            )
            async with anyio.create_task_group() as tg:
                await tg.start(supervisor.run)
                if self.training:
                    await self._start_training(tg, env, pool, stack, supervisor)
                if self.api:
                    token = self.api_token
                    if token is None:
                        token = endpoint_token(served.endpoint, {})
                    serve = functools.partial(
                        serve_api, self, served, environment=env, pool=pool, stack=stack,
                        token=token,
                    )  # fmt: skip
                    self.api_url = await tg.start(serve)
                if served.daemon.watch_adapters and not self.training:
                    tg.start_soon(
                        publish_new_folders, stack.adapters, Path(served.daemon.watch_adapters)
                    )
                task_status.started()
                await self._stop.wait()
                if self._training is not None:
                    await self._training.drain(served.daemon.drain_timeout_s)
                    # Every group the drain sent must be stored and journaled before the
                    # task group is cancelled: the scheduler closed its stream, so the pump
                    # ends once it has handed its last group on, and the learner once it
                    # has journaled it (an update in progress finishes first).
                    await self._training.done.wait()
                # Agent runs in flight end with the task group (recorded as interrupted).
                tg.cancel_scope.cancel()
            if self.training:
                await self._plotter.draw()  # the curve as the run ended

    async def _start_training(
        self,
        tg: anyio.abc.TaskGroup,
        env: Environment,
        pool: BrowserPool,
        stack: PolicyStack,
        supervisor: ServerSupervisor,
    ) -> None:
        self._training = training = Training(
            self.config,
            model=self.model,
            run_dir=self.run_dir,
            stack=stack,
            supervisor=supervisor,
            stopping=self._stop,
            record=self.record,
            url_overrides=self.url_overrides,
            judge_key=self.judge_key,
            denied=pool.denied,
            http=self._http,
            generator_key=self.generator_key,
        )
        await training.start(tg, env, pool)
        self._evaluations = evaluations = PeriodicEvaluations(
            self.config, self.run_dir, self.record
        )
        tg.start_soon(evaluations.run, env, pool, stack)
        tg.start_soon(self._plotter.run)
        if self.config.daemon.eval_every and self.config.daemon.eval_at_start:
            evaluations.want(self._updates)  # the starting version's success, before any update

    async def _unless_stopped(self, making: Awaitable[str]) -> str:
        """`making` (the bootstrap), given up ("" returned) when the daemon is stopped."""
        model = ""
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                await self._stop.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            model = await making
            tg.cancel_scope.cancel()
        return model

    def _hold_for_policy(self, down: bool) -> None:
        if self._training is not None:
            self._training.hold_for_policy(down)

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if self._stop.is_set():
                    log.warning("daemon.signal_again", signal=name, hint="stopping already")
                    continue
                self.stop(name)
