"""`webagent trajectories show RUN_OR_FILE`: a readable account of stored groups."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from runtime.actions import format_action
from runtime.base.messages import Trajectory, TrajectoryGroup
from runtime.errors import StoreError, UsageError
from runtime.store import iter_groups, read_group, store_path

__all__ = ["print_group", "register"]


def register(sub: Any) -> None:
    parser = sub.add_parser("trajectories", help="read a trajectory store")
    cmds = parser.add_subparsers(title="trajectories commands", metavar="ACTION", required=True)
    show = cmds.add_parser("show", help="print groups: per episode its status, reward and turns")
    show.add_argument("store", metavar="RUN_OR_FILE", help="a run directory or a store file")
    show.add_argument("--group", metavar="ID", help="only this group")
    show.add_argument("--limit", type=int, default=0, help="only the last N groups")
    show.add_argument(
        "--observations", action="store_true", help="also print each turn's observation"
    )
    show.set_defaults(func=_show)


def _short(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _print_trajectory(trajectory: Trajectory, out: TextIO, *, observations: bool) -> None:
    seconds = trajectory.finished_at - trajectory.started_at
    out.write(
        f"  episode {trajectory.episode_id}: {trajectory.status}, reward {trajectory.reward:g}, "
        f"{len(trajectory.turns)} turns, {seconds:.1f} s, answer {trajectory.answer!r}\n"
    )
    if trajectory.evaluation is not None:
        for check in trajectory.evaluation.checks:
            verdict = {True: "pass", False: "FAIL", None: "unjudged"}[check.passed]
            out.write(f"    check {check.kind}: {verdict} {_short(check.detail)}\n")
    for turn in trajectory.turns:
        adapter = f" [{turn.adapter}]" if turn.adapter else ""
        out.write(f"    turn {turn.index}{adapter} {turn.url}\n")
        if turn.thought:
            out.write(f"      think: {_short(turn.thought)}\n")
        if turn.action is not None:
            out.write(f"      action: {format_action(turn.action)}\n")
        if turn.parse_error:
            out.write(f"      parse error: {turn.parse_error}\n")
        if turn.action_error:
            out.write(f"      action error: {turn.action_error}\n")
        if observations:
            for line in turn.observation.splitlines():
                out.write(f"      | {line}\n")


def print_group(group: TrajectoryGroup, out: TextIO, *, observations: bool = False) -> None:
    """One group, readably."""
    won = sum(1 for t in group.trajectories if t.reward > 0)
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(group.created_at))
    split = f" ({group.split})" if group.split else ""
    out.write(
        f"group {group.group_id}: task {group.task_id}{split}, {created}, "
        f"{won}/{len(group.trajectories)} succeeded\n"
    )
    if group.trajectories:
        out.write(f"  intent: {_short(group.trajectories[0].intent, 300)}\n")
    for trajectory in group.trajectories:
        _print_trajectory(trajectory, out, observations=observations)


def _show(args: argparse.Namespace) -> int:
    path = store_path(args.store)
    if not path.exists():
        raise UsageError(f"{args.store}: no trajectory store there")
    try:
        if args.group:
            groups = [read_group(path, args.group)]
        else:
            groups = list(iter_groups(path))
            if args.limit > 0:
                groups = groups[-args.limit :]
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from exc
    except StoreError as exc:
        raise UsageError(str(exc)) from exc
    episodes = sum(len(g.trajectories) for g in groups)
    won = sum(1 for g in groups for t in g.trajectories if t.reward > 0)
    for group in groups:
        print_group(group, sys.stdout, observations=args.observations)
    print(f"{len(groups)} groups, {episodes} episodes, {won} succeeded ({path})")
    return 0
