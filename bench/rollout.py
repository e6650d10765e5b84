"""Rollout throughput with the oracle policy: our runtime against a baseline and the limit.

    .venv/bin/python -m bench.rollout [--levels 1,4,16,32,64] [--repeats 2]
                                      [--min-episodes 16] [--group-size 4]
                                      [--baseline-sleep-s 0.5] [--baseline-episodes 6]
                                      [--style html] [--out bench/out]

At each concurrency level C, three loops run the same oracle episodes on the built-in
sites' test split (the first `--tasks` tasks, cycled; max(C, `--min-episodes`) episodes
in groups of `--group-size`), each with its own Chromium (headless shell) launched
before the clock starts:

- ours: `runtime.task_runs.run_tasks` (scheduler, rollout, episodes with observation,
  allowlist, oracle policy, action execution, evaluation), C episodes in flight;
- baseline, in the style of the reference WebAgent-R1 implementation: the episodes of a
  group stepped one after another (round-robin over min(C, `--baseline-episodes`) open
  episodes), with a fixed sleep of `--baseline-sleep-s` after each action; it uses the
  same runtime pieces for observing, acting and evaluating, so only the scheduling
  differs. Sequential, so its rate does not depend on C: it runs fewer episodes;
- limit: a bare Playwright loop with nothing around it: per episode a context with the
  tenant cookie, `page.goto`, then per step `page.evaluate(observe.js)` and the same
  click/fill/select/scroll the oracle did in our run (its recorded actions and ids
  replayed), C episodes at once. No rendering to text, no allowlist, no evaluation.

Reported per loop: episodes/s, steps/s, median and p95 step latency (observe + policy +
act, without the baseline's fixed sleep), peak PSS of this process tree (Python with the
in-process sites + Chromium's processes), sampled every 0.5 s. Figures are medians over
`--repeats`; the ratios our/baseline and our/limit are of steps/s measured in the same
run. Prints a table last and writes the JSON to `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from playwright.async_api import Page, async_playwright

from bench.common import (
    LoadSampler,
    finish,
    load_note,
    median,
    percentile,
    with_style,
)
from policy.prompt import build_messages
from runtime.actions import parse_completion
from runtime.base.config import Config, load_config
from runtime.base.messages import Action, PolicyRequest, TaskConfig, Trajectory
from runtime.browser import CHROMIUM_ARGS, BrowserPool, find_chromium
from runtime.environment import Environment, EpisodeSetup
from runtime.episode import EpisodeSettings
from runtime.errors import ActionError, ParseError
from runtime.logs import configure_logging
from runtime.observation import ID_ATTRIBUTE, _wrapped_script
from runtime.oracle import OraclePolicy
from runtime.session import Allowlist, BrowserSession
from runtime.task_runs import run_tasks
from runtime.webarena_environment import open_environment


@dataclass
class Phase:
    """One loop at one level, one repeat."""

    episodes: int = 0
    steps: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    peak_pss_mib: float = 0.0
    successes: int = 0
    errors: int = 0

    def summary(self) -> dict[str, float]:
        return {
            "episodes": self.episodes,
            "steps": self.steps,
            "seconds": self.seconds,
            "episodes_per_s": self.episodes / self.seconds if self.seconds else math.nan,
            "steps_per_s": self.steps / self.seconds if self.seconds else math.nan,
            "latency_median_s": median(self.latencies),
            "latency_p95_s": percentile(self.latencies, 0.95),
            "peak_pss_mib": self.peak_pss_mib,
            "successes": self.successes,
            "errors": self.errors,
        }


@dataclass
class _Live:
    """One open episode of the baseline loop."""

    k: int
    setup: EpisodeSetup
    session: BrowserSession
    history: list[str] = field(default_factory=list)
    error: str | None = None
    answer: str = ""


def _task_list(tasks: Sequence[TaskConfig], episodes: int, group_size: int) -> list[TaskConfig]:
    groups = max(1, math.ceil(episodes / group_size))
    return [tasks[i % len(tasks)] for i in range(groups)]


def _browser_config(config: Config, contexts: int) -> Any:
    return msgspec.structs.replace(config.browser, max_contexts=max(1, contexts))


# --------------------------------------------------------------------------- ours


async def run_ours(
    config: Config, env: Environment, tasks: list[TaskConfig], *, concurrency: int, group: int
) -> tuple[Phase, list[Trajectory]]:
    policy = OraclePolicy(style=config.observation.style)
    async with BrowserPool(_browser_config(config, concurrency)) as pool:
        with LoadSampler() as load:
            result = await run_tasks(
                config,
                env,
                policy,
                tasks,
                split="test",
                group_size=group,
                concurrency=concurrency,
                pool=pool,
            )
    trajectories = [t for g in result.groups for t in g.trajectories]
    phase = Phase(
        episodes=len(trajectories),
        steps=sum(len(t.turns) for t in trajectories),
        seconds=result.seconds,
        latencies=[
            tn.timings.observe_s + tn.timings.policy_s + tn.timings.act_s
            for t in trajectories
            for tn in t.turns
        ],
        peak_pss_mib=load.peak_pss_mib,
        successes=sum(1 for t in trajectories if t.reward > 0),
        errors=sum(1 for t in trajectories if t.status.startswith("error")),
    )
    return phase, trajectories


# --------------------------------------------------------------------------- baseline


async def run_baseline(
    config: Config, env: Environment, tasks: list[TaskConfig], *, episodes: int, sleep_s: float
) -> Phase:
    """The reference's style: one group's episodes stepped one after another, a fixed
    sleep after each action; same observation, oracle, actions and evaluation as ours."""
    settings = EpisodeSettings.from_config(config)
    policy = OraclePolicy(style=config.observation.style)
    phase = Phase()
    chosen = [tasks[i % len(tasks)] for i in range(episodes)]
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=find_chromium(config.browser.executable_path),
            args=list(CHROMIUM_ARGS),
            headless=True,
        )
        with LoadSampler() as load:
            started = time.monotonic()
            async with contextlib.AsyncExitStack() as stack:
                stack.push_async_callback(browser.close)
                live = []
                for k, task in enumerate(chosen):
                    setup = await stack.enter_async_context(env.episode(task))
                    context = await browser.new_context(
                        viewport={
                            "width": config.browser.viewport_width,
                            "height": config.browser.viewport_height,
                        },
                        accept_downloads=False,
                        service_workers="block",
                    )
                    session = BrowserSession(
                        context, config.browser, Allowlist.from_urls(setup.allowed)
                    )
                    stack.push_async_callback(session.close)
                    await session.start()
                    if setup.cookies:
                        await context.add_cookies(setup.cookies)  # type: ignore[arg-type]
                    await session.open(setup.start_urls)
                    live.append(_Live(k, setup, session))
                for turn in range(settings.max_turns):
                    if not live:
                        break
                    for ep in list(live):
                        setup, session = ep.setup, ep.session
                        t0 = time.perf_counter()
                        obs = await session.observe(settings.observation, error=ep.error)
                        messages = build_messages(setup.task.intent, ep.history, obs.text)
                        reply = await policy.act(
                            PolicyRequest(
                                episode_id=f"b{ep.k}", turn=turn, task=setup.task, messages=messages
                            )
                        )
                        ep.error = None
                        done = False
                        try:
                            action = parse_completion(reply.text).action
                        except ParseError as exc:
                            ep.error = str(exc)
                            action = None
                        if action is not None and action.kind == "exit":
                            done = True
                            ep.answer = action.message or ""
                        elif action is not None:
                            try:
                                await session.execute(action)
                            except ActionError as exc:
                                ep.error = str(exc)
                        phase.latencies.append(time.perf_counter() - t0)
                        phase.steps += 1
                        ep.history.append(reply.text)
                        await anyio.sleep(sleep_s)
                        if done:
                            live.remove(ep)
                            evaluation = await env.evaluate(
                                setup.task,
                                answer=ep.answer,
                                page=session.page,
                                urls=setup.urls,
                            )
                            phase.successes += evaluation.reward > 0
                phase.episodes = len(chosen)
                phase.seconds = time.monotonic() - started
    phase.peak_pss_mib = load.peak_pss_mib
    return phase


# --------------------------------------------------------------------------- limit


async def _bare_action(page: Page, action: Action, selector: str, timeout_ms: float) -> None:
    match (action.kind, action.name):
        case ("go_backward", _):
            await page.go_back()
        case ("go_forward", _):
            await page.go_forward()
        case (_, "Click"):
            await page.locator(selector).click(timeout=timeout_ms)
        case (_, "Type"):
            await page.locator(selector).fill(action.argument or "", timeout=timeout_ms)
        case (_, "Search"):
            await page.locator(selector).fill(action.argument or "", timeout=timeout_ms)
            await page.locator(selector).press("Enter", timeout=timeout_ms)
        case (_, "Select Dropdown Option"):
            await page.locator(selector).select_option(
                label=action.argument or "", timeout=timeout_ms
            )
        case (_, "Hover"):
            await page.locator(selector).hover(timeout=timeout_ms)
        case (_, "Scroll Down" | "Scroll Up" as name):
            sign = 1 if name == "Scroll Down" else -1
            await page.evaluate("(dy) => window.scrollBy(0, dy)", sign * 864)
        case (_, "Press Enter"):
            await page.keyboard.press("Enter")
        case (_, "Goto"):
            await page.goto(action.argument or "", wait_until="load")
        case _:
            pass


async def run_limit(
    config: Config, env: Environment, episodes: list[Trajectory], tasks: dict[int, TaskConfig],
    *, concurrency: int,
) -> Phase:  # fmt: skip
    """The same episodes' actions replayed by bare Playwright with observe.js per step."""
    phase = Phase(episodes=len(episodes))
    script = _wrapped_script()
    obs = config.observation
    args = {
        "idAttr": ID_ATTRIBUTE,
        "maxText": obs.max_text_chars,
        "attributes": list(obs.attributes),
    }
    timeout_ms = config.browser.action_timeout_s * 1000
    limiter = anyio.CapacityLimiter(concurrency)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=find_chromium(config.browser.executable_path),
            args=list(CHROMIUM_ARGS),
            headless=True,
        )
        try:

            async def one(trajectory: Trajectory) -> None:
                task = tasks[trajectory.task_id]
                async with limiter, env.episode(task) as setup:
                    context = await browser.new_context(
                        viewport={
                            "width": config.browser.viewport_width,
                            "height": config.browser.viewport_height,
                        }
                    )
                    try:
                        if setup.cookies:
                            await context.add_cookies(setup.cookies)  # type: ignore[arg-type]
                        page = await context.new_page()
                        await page.goto(setup.start_urls[0], wait_until="load")
                        for turn in trajectory.turns:
                            t0 = time.perf_counter()
                            await page.wait_for_load_state("load")
                            msgspec.json.decode(await page.evaluate(script, args))
                            action = turn.action
                            if action is not None and action.kind != "exit":
                                selector = f'[{ID_ATTRIBUTE}="{action.element}"]'
                                try:
                                    await _bare_action(page, action, selector, timeout_ms)
                                except Exception:  # a replay that diverged: counted
                                    phase.errors += 1
                            phase.latencies.append(time.perf_counter() - t0)
                            phase.steps += 1
                    finally:
                        await context.close()

            with LoadSampler() as load:
                started = time.monotonic()
                async with anyio.create_task_group() as tg:
                    for trajectory in episodes:
                        tg.start_soon(one, trajectory)
                phase.seconds = time.monotonic() - started
        finally:
            await browser.close()
    phase.peak_pss_mib = load.peak_pss_mib
    return phase


# --------------------------------------------------------------------------- driver


async def run(args: argparse.Namespace) -> dict[str, Any]:
    config = with_style(load_config(args.config), args.style)
    levels = [int(x) for x in args.levels.split(",")]
    out: dict[str, Any] = {"levels": {}}
    async with open_environment(config) as env:
        tasks = env.tasks("test")[: args.tasks]
        by_id = {t.task_id: t for t in env.tasks("test")}
        # Warm-up: the sites' first requests and the Python caches, off the clock.
        await run_ours(config, env, tasks[:1], concurrency=1, group=1)
        for level in levels:
            n = max(level, args.min_episodes)
            chosen = _task_list(tasks, n, args.group_size)
            runs: dict[str, list[dict[str, float]]] = {"ours": [], "baseline": [], "limit": []}
            for repeat in range(args.repeats):
                ours, trajectories = await run_ours(
                    config, env, chosen, concurrency=level, group=args.group_size
                )
                runs["ours"].append(ours.summary())
                limit = await run_limit(config, env, trajectories, by_id, concurrency=level)
                runs["limit"].append(limit.summary())
                if args.baseline_episodes:
                    base = await run_baseline(
                        config,
                        env,
                        tasks,
                        episodes=min(level, args.baseline_episodes),
                        sleep_s=args.baseline_sleep_s,
                    )
                    runs["baseline"].append(base.summary())
                print(
                    f"level {level} repeat {repeat}: ours {ours.summary()['steps_per_s']:.1f} "
                    f"steps/s, limit {limit.summary()['steps_per_s']:.1f}",
                    flush=True,
                )
            out["levels"][level] = {
                "episodes": n,
                "runs": runs,
                "median": {
                    loop: {key: median(r[key] for r in items) for key in items[0]}
                    for loop, items in runs.items()
                    if items
                },
            }
    return out


def _table(result: dict[str, Any]) -> dict[str, Any]:
    headers = [
        "C", "loop", "episodes", "eps/s", "steps/s", "lat p50 ms", "lat p95 ms",
        "peak PSS MiB", "success", "ours/this steps/s",
    ]  # fmt: skip
    rows: list[list[object]] = []
    for level, entry in result["levels"].items():
        med = entry["median"]
        ours = med["ours"]["steps_per_s"]
        for loop in ("ours", "baseline", "limit"):
            if loop not in med:
                continue
            m = med[loop]
            rows.append(
                [
                    int(level),
                    loop,
                    int(m["episodes"]),
                    m["episodes_per_s"],
                    m["steps_per_s"],
                    m["latency_median_s"] * 1000,
                    m["latency_p95_s"] * 1000,
                    m["peak_pss_mib"],
                    f"{int(m['errors'])} replay errors"
                    if loop == "limit"
                    else f"{int(m['successes'])}/{int(m['episodes'])}",
                    ours / m["steps_per_s"] if m["steps_per_s"] else math.nan,
                ]
            )
    return {
        "title": "oracle rollouts on the built-in test split (medians over repeats)",
        "headers": headers,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="TOML file over the defaults")
    parser.add_argument(
        "--style", default="html", choices=("html", "compact"), help="observation style"
    )
    parser.add_argument("--levels", default="1,4,16,32,64", help="concurrency levels")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=16, help="first N test tasks, cycled")
    parser.add_argument("--min-episodes", type=int, default=16, help="episodes per level")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--baseline-sleep-s", type=float, default=0.5)
    parser.add_argument("--baseline-episodes", type=int, default=6, help="0 skips it")
    parser.add_argument("--out", default="bench/out", help="folder for the JSON")
    args = parser.parse_args()
    configure_logging(level="warning")
    with LoadSampler(interval_s=2.0) as load:
        result = anyio.run(run, args)
    table = _table(result)
    notes = [
        f"baseline: episodes of a group stepped one after another, {args.baseline_sleep_s} s "
        f"sleep after each action, min(C, {args.baseline_episodes}) episodes; latency excludes "
        "the sleep",
        "limit: bare Playwright replaying our run's actions with observe.js per step",
        "last column: our steps/s divided by this loop's (ours/baseline, ours/limit)",
        load_note(load),
    ]
    finish(args.out, "rollout", result, table=table, notes=notes, load=load)


if __name__ == "__main__":
    main()
