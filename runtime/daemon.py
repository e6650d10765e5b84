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
"""

from __future__ import annotations

import contextlib
import random
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import structlog
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from runtime.agent_episode import run_agent_episode
from runtime.agent_runs import RunOutcome, RunService
from runtime.base.config import Config, dump_config
from runtime.base.files import write_atomic
from runtime.base.messages import (
    EvalFinished,
    Event,
    RunRequest,
    RunTurn,
    TaskConfig,
    TrajectoryGroup,
    UpdateApplied,
)
from runtime.bootstrap import BootstrapProgress
from runtime.browser import BrowserPool
from runtime.environment import Environment
from runtime.episode import EpisodeSettings
from runtime.metrics import MetricsBook, plot_learning_curve
from runtime.supervisor import ServerSupervisor
from sites.judge import HttpJudge

__all__ = ["Daemon"]

log = structlog.get_logger("runtime.daemon")

# The learning curve is redrawn at most this often (matplotlib costs ~0.3 s a figure).
_PLOT_EVERY_S = 10.0


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
    ) -> None:
        self.config = config
        self.judge_key = judge_key  # the API key of `sites.judge_url` (never logged)
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
        self._plot_wanted = anyio.Event()
        self._eval_wanted: MemoryObjectSendStream[int] | None = None
        self._pool: BrowserPool | None = None
        self._environment: Environment | None = None
        self._stack: Any = None
        self._learner: Any = None
        self._scheduler: Any = None
        self._runs: RunService | None = None
        self._supervisor: ServerSupervisor | None = None
        self._updates = 0
        # Set once the learner's loop has returned (or at once when not training).
        self._learning_done = anyio.Event()
        if not self.training:
            self._learning_done.set()

    # ------------------------------------------------------------------ control

    def stop(self, reason: str = "requested") -> None:
        """Begin a graceful stop (idempotent)."""
        if not self._stop.is_set():
            self._stopped_by = reason
            log.info("daemon.stopping", reason=reason)
            if self._learner is not None:
                self._learner.hold()  # groups from the drain are trained after a restart
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
        result = await self._stack.adapters.publish(path)
        return str(result.name)

    # ------------------------------------------------------------------ books

    def record(self, event: Event) -> None:
        self.book.record(event)
        if isinstance(event, UpdateApplied):
            self._updates += 1
            self._plot_wanted.set()
            every = self.config.daemon.eval_every
            if every and self._updates % every == 0:
                self._want_eval()
            limit = self.config.daemon.max_updates
            if limit and self._updates >= limit:
                self.stop(f"max_updates={limit} reached")

    async def emit(self, event: Event) -> None:
        self.record(event)

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": "training" if self.training else "serving",
            "model": self.model,
            "stage": "running" if self.model else self._bootstrap.describe() or "starting",
            "uptime_s": round(time.time() - self.started_at, 1),
            "stopping": self._stop.is_set(),
            **self.book.summary(),
        }
        if self._environment is not None:
            out["sites"] = dict(self._environment.urls)
        if self._supervisor is not None:
            out["server"] = msgspec.to_builtins(self._supervisor.statistics())
        if self._stack is not None:
            out["adapters"] = msgspec.to_builtins(self._stack.adapters.statistics())
            out["policy"] = msgspec.to_builtins(self._stack.policy.statistics())
        if self._scheduler is not None:
            out["scheduler"] = msgspec.to_builtins(self._scheduler.statistics())
        if self._learner is not None:
            out["learner"] = msgspec.to_builtins(self._learner.statistics())
        if self._pool is not None:
            out["browser"] = msgspec.to_builtins(self._pool.statistics())
        return out

    def prometheus(self) -> str:
        return self.book.prometheus(
            server=self._supervisor.statistics() if self._supervisor is not None else None,
            scheduler=self._scheduler.statistics() if self._scheduler is not None else None,
        )

    # ------------------------------------------------------------------ running

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until stopped; `task_status.started()` once rollouts (or the API) run."""
        from runtime.webarena_environment import open_environment

        config = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.run_dir / "config.toml", dump_config(config).encode())
        self.book = MetricsBook(self.run_dir / "metrics.jsonl")
        log.info("daemon.starting", run_dir=str(self.run_dir), training=self.training, api=self.api)
        try:
            async with (
                anyio.create_task_group() as outer,
                BrowserPool(
                    config.browser, denied=_endpoint_address(config), on_event=self.record
                ) as pool,
                httpx.AsyncClient() as judge_http,
                open_environment(
                    config,
                    url_overrides=self.url_overrides,
                    browser=pool,
                    judge=HttpJudge.from_config(config.sites, judge_http, api_key=self.judge_key),
                ) as env,
            ):
                outer.start_soon(self._signals)
                self._pool, self._environment = pool, env
                await self._run_with(env, pool, task_status)
                outer.cancel_scope.cancel()
        finally:
            self.book.close()
            log.info("daemon.stopped", reason=self._stopped_by or "error", updates=self._updates)

    async def _run_with(
        self, env: Environment, pool: BrowserPool, task_status: TaskStatus[None]
    ) -> None:
        from runtime.bootstrap import prepare_model
        from runtime.policystack import policy_stack

        config = self.config
        if self.training:
            self.model = await self._prepare(prepare_model, config, env)
            if self._stop.is_set():  # stopped while the first run made its model
                task_status.started()
                return
        else:
            self.model = config.policy.model
        if not self.model and not self.training:
            from runtime.bootstrap import BootstrapPaths

            self.model = str(BootstrapPaths(config.daemon.data_dir).bc)
        served = msgspec.structs.replace(
            config, policy=msgspec.structs.replace(config.policy, model=self.model)
        )
        self.config = served  # episodes' settings follow the served model's profile
        first: Path | None = None  # training: the learner publishes its first version
        if not self.training:
            from learner.lora import zero_adapter

            first = await anyio.to_thread.run_sync(
                zero_adapter, self.model, Path(config.daemon.data_dir) / "adapters",
                config.learner,
            )  # fmt: skip
        async with policy_stack(
            served,
            adapter=first,
            log_path=self.run_dir / "vllm.log",
            on_event=self.record,
        ) as stack:
            self._stack = stack
            pool.deny(stack.server.url)  # no page may reach the policy server
            self._supervisor = ServerSupervisor(
                served.policy,
                server=stack.server,
                client=stack.client,
                adapters=stack.adapters,
                on_down=lambda reason: self._hold_for_policy(True),
                on_up=lambda: self._hold_for_policy(False),
                on_event=self.record,
            )
            async with anyio.create_task_group() as tg:
                await tg.start(self._supervisor.run)
                evals_send, evals_recv = anyio.create_memory_object_stream[int](1)
                self._eval_wanted = evals_send
                if self.training:
                    await self._start_training(tg, env, pool, stack)
                    tg.start_soon(self._evaluations, evals_recv, env, pool, stack)
                    tg.start_soon(self._plots)
                else:
                    evals_recv.close()
                if self.api:
                    await tg.start(self._serve_api, env, pool, stack)
                if self.config.daemon.watch_adapters and not self.training:
                    tg.start_soon(self._watch_adapters, stack)
                task_status.started()
                await self._stop.wait()
                await self._drain()
                # Every group the drain sent must be stored and journaled before the task
                # group is cancelled: the scheduler closed its stream, so the pump ends
                # once it has handed its last group on, and the learner once it has
                # journaled it (an update in progress finishes first).
                await self._learning_done.wait()
                tg.cancel_scope.cancel()
            if self.training:
                await self._draw()  # the curve as the run ended

    async def _prepare(self, prepare: Any, config: Config, env: Environment) -> str:
        """`prepare(config, env)` (the bootstrap), given up when the daemon is stopped."""
        model = ""
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                await self._stop.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            model = await prepare(config, env, progress=self._bootstrap)
            tg.cancel_scope.cancel()
        return model

    async def _start_training(
        self, tg: anyio.abc.TaskGroup, env: Environment, pool: BrowserPool, stack: Any
    ) -> None:
        from learner.trainer import Learner
        from runtime.rollout import Rollout
        from runtime.scheduler import Scheduler
        from runtime.store import TrajectoryStore, read_groups, unseen_groups

        config = self.config
        store_path = self.run_dir / "trajectories.jsonl"
        store = TrajectoryStore(store_path)

        def read(ids: Any) -> list[TrajectoryGroup]:
            return read_groups(store_path, ids)

        self._learner = Learner(
            config.learner,
            base_model=self.model,
            out_dir=self.run_dir / "learner",
            publish=self._publish,
            emit=self.emit,
            read_groups=read,
            decode=stack.renderer.decode,
            adapter_prefix=config.policy.adapter_prefix,
            temperature=config.policy.temperature,
            on_updating=self._hold_for_update if config.learner.max_staleness == 0 else None,
        )
        if self._stop.is_set():  # a stop that came during start-up holds it too
            self._learner.hold()
        groups_send, groups_recv = anyio.create_memory_object_stream[TrajectoryGroup](
            config.scheduler.stream_buffer
        )
        learn_send, learn_recv = anyio.create_memory_object_stream[TrajectoryGroup](0)
        version = await tg.start(self._learn, learn_recv)
        log.info("daemon.learner_ready", version=version)
        rollout = Rollout(
            environment=env,
            pool=pool,
            policy=stack.policy,
            settings=EpisodeSettings.from_config(config),
            max_episodes=config.scheduler.max_episodes_in_flight,
            count_tokens=stack.renderer.count_tokens,
            on_event=self.record,
        )
        self._scheduler = Scheduler(
            rollout=rollout,
            tasks=env.tasks(config.scheduler.split),
            send=groups_send,
            group_size=config.scheduler.group_size,
            max_groups=config.scheduler.max_groups_in_flight,
            split=config.scheduler.split,
            seed=config.scheduler.seed + self._updates_done(),
            curriculum=config.scheduler.curriculum,
        )
        if config.scheduler.curriculum == "signal":
            curriculum, split = self._scheduler.curriculum, config.scheduler.split
            await anyio.to_thread.run_sync(curriculum.observe_store, store_path, split)
        if config.learner.max_staleness == 0 and self._learner.statistics().updating:
            self._scheduler.hold_for_update(True)  # released when that update is published
        if self._supervisor is not None and not self._supervisor.is_up:
            self._scheduler.hold_for_policy(True)  # released when the server is back
        # Stored but never journaled (a kill between the two): handed to the learner first.
        unjournaled = await anyio.to_thread.run_sync(
            unseen_groups, store_path, self._learner.has_seen
        )
        if unjournaled:
            log.warning("daemon.unjournaled_groups", groups=[g.group_id for g in unjournaled])
        tg.start_soon(self._scheduler.run)
        tg.start_soon(self._pump, groups_recv, learn_send, store, unjournaled)
        self._want_eval()  # the starting version's success, before any update

    async def _learn(
        self,
        groups: MemoryObjectReceiveStream[TrajectoryGroup],
        *,
        task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            await self._learner.run(groups, task_status=task_status)
        finally:
            self._learning_done.set()

    def _hold_for_policy(self, down: bool) -> None:
        """No new turns while the policy server is down (they would fail for want of it)."""
        if self._scheduler is not None:
            self._scheduler.hold_for_policy(down)

    def _hold_for_update(self, updating: bool) -> None:
        """`max_staleness` 0: no new turns while the learner updates (a group with a turn
        of the version being replaced is stale once the update is published)."""
        if self._scheduler is not None:
            self._scheduler.hold_for_update(updating)

    def _updates_done(self) -> int:
        return 0 if self._learner is None else max(self._learner.version, 0)

    async def _publish(self, path: Path) -> None:
        if self._supervisor is None:
            await self._stack.adapters.publish(path)
        else:
            await self._supervisor.publish(path, stopping=self._stop)

    async def _pump(
        self,
        groups: MemoryObjectReceiveStream[TrajectoryGroup],
        learner: MemoryObjectSendStream[TrajectoryGroup],
        store: Any,
        unjournaled: list[TrajectoryGroup],
    ) -> None:
        """Every finished group: stored (fsynced) first, then handed to the learner;
        `unjournaled` (stored already) goes to the learner before them."""
        async with groups, learner:
            try:
                for group in unjournaled:
                    await learner.send(group)
                async for group in groups:
                    await store.append_async(group)
                    await learner.send(group)
            finally:
                store.close()

    async def _drain(self) -> None:
        if self._scheduler is not None:
            await self._scheduler.stop(self.config.daemon.drain_timeout_s)
        # Agent runs in flight end with the daemon's task group (recorded as interrupted).

    def _want_eval(self) -> None:
        if self._eval_wanted is None or not self.config.daemon.eval_every:
            return
        with contextlib.suppress(anyio.WouldBlock):  # one is pending already
            self._eval_wanted.send_nowait(self._updates)

    async def _evaluations(
        self,
        wanted: MemoryObjectReceiveStream[int],
        env: Environment,
        pool: BrowserPool,
        stack: Any,
    ) -> None:
        from runtime.evaluation import run_evaluation

        config = self.config
        # A quarter of the rollouts' episodes: evaluations share the policy's request slots
        # with the training rollouts and must not starve them.
        concurrency = max(1, config.scheduler.max_episodes_in_flight // 4)
        sampling = msgspec.structs.replace(
            stack.policy.sampling, temperature=config.daemon.eval_temperature
        )
        policy = stack.policy.with_sampling(sampling)
        async with wanted:
            async for updates in wanted:
                version = stack.adapters.current.version if stack.adapters.current else 0
                for split in ("test", "ood"):
                    try:
                        tasks = _eval_tasks(
                            env, split, config.daemon.eval_episodes, config.scheduler.seed
                        )
                    except KeyError:
                        continue
                    report = await run_evaluation(
                        config,
                        env,
                        policy,
                        tasks,
                        out_dir=self.run_dir / "eval" / f"u{updates:05d}-{split}",
                        concurrency=concurrency,
                        title=f"{split} after {updates} updates (v{version})",
                        pool=pool,
                        count_tokens=stack.renderer.count_tokens,
                    )
                    by_site = {
                        title: cell.rate for title, cell in report.table.items() if cell.episodes
                    }
                    self.record(
                        EvalFinished(
                            at=time.time(),
                            split=split,
                            version=version,
                            episodes=report.episodes,
                            success=report.success_rate,
                            by_site=by_site,
                        )
                    )
                self._plot_wanted.set()

    async def _plots(self) -> None:
        while True:
            await self._plot_wanted.wait()
            self._plot_wanted = anyio.Event()
            await self._draw()
            await anyio.sleep(_PLOT_EVERY_S)

    async def _draw(self) -> None:
        png = self.run_dir / "learning_curve.png"
        try:
            await anyio.to_thread.run_sync(plot_learning_curve, self.run_dir / "metrics.jsonl", png)
        except Exception as exc:  # a plot is a report, never a reason to stop training
            log.warning("daemon.plot_failed", error=repr(exc))

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if self._stop.is_set():
                    log.warning("daemon.signal_again", signal=name, hint="stopping already")
                    continue
                self.stop(name)

    async def _serve_api(
        self,
        env: Environment,
        pool: BrowserPool,
        stack: Any,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        from runtime.api import build_app
        from runtime.base.http import serve_asgi
        from runtime.guard import RunTargets, endpoint_token, http_limits, intent_budget

        config = self.config
        token = self.api_token
        if token is None:
            token = endpoint_token(config.endpoint, {})
        targets = RunTargets(
            own=[stack.server.url],
            site_urls=env.urls.values(),
            count_tokens=stack.renderer.count_tokens,
            max_intent_tokens=intent_budget(config),
        )

        settings = EpisodeSettings.from_config(config)

        async def execute(
            run_id: str, request: RunRequest, on_turn: Callable[[RunTurn], None]
        ) -> RunOutcome:
            return await run_agent_episode(
                run_id, request, on_turn, env=env, pool=pool, policy=stack.policy,
                settings=settings, count_tokens=stack.renderer.count_tokens,
            )  # fmt: skip

        def validate(request: RunRequest) -> None:
            if request.adapter is not None and stack.adapters.resident(request.adapter) is None:
                raise ValueError(f"adapter {request.adapter!r} is not served")

        async with RunService(
            execute,
            max_runs=config.endpoint.max_runs,
            max_turns=config.endpoint.max_turns,
            validate=validate,
        ) as runs:
            self._runs = runs
            app = build_app(
                controls=self, runs=runs, token=token, endpoint=config.endpoint, targets=targets
            )
            async with serve_asgi(
                app,
                host=config.endpoint.host,
                port=config.endpoint.port,
                limits=http_limits(config.endpoint),
            ) as url:
                targets.add_own(url)
                self.api_url = url
                log.info("daemon.api", url=url, auth=bool(token))
                task_status.started()
                await anyio.sleep_forever()

    async def _watch_adapters(self, stack: Any) -> None:
        """Hot reload: every new folder with a manifest under `watch_adapters` is served."""
        from watchfiles import awatch

        folder = Path(self.config.daemon.watch_adapters)
        await anyio.Path(folder).mkdir(parents=True, exist_ok=True)
        async for changes in awatch(folder, recursive=True):
            manifests = sorted({Path(p) for _, p in changes if Path(p).name == "manifest.json"})
            for manifest in manifests:
                try:
                    result = await stack.adapters.publish(manifest.parent)
                    log.info("daemon.hot_reload", adapter=result.name, path=str(manifest.parent))
                except Exception as exc:  # a bad folder is refused and reported, not fatal
                    log.warning(
                        "daemon.hot_reload_refused", path=str(manifest.parent), error=str(exc)
                    )


def _eval_tasks(env: Environment, split: str, episodes: int, seed: int) -> list[TaskConfig]:
    """A fixed, seeded subset of a split: the same tasks at every evaluation."""
    tasks = env.tasks(split)
    order = list(tasks)
    random.Random(f"eval:{seed}:{split}").shuffle(order)
    return order[: min(len(order), max(1, episodes))]


def _endpoint_address(config: Config) -> list[tuple[str, int]]:
    """The control API's (host, port), which no page may reach (port 0: none yet)."""
    return [(config.endpoint.host, config.endpoint.port)] if config.endpoint.port else []
