"""What a training run's guided starts did, read from its trajectory store.

    .venv/bin/python -m bench.guided RUN_DIR [--builtin-seed N]

Guided starts (`scheduler.guide_longer_than`, `runtime/guided.py`) give the policy a task
in its middle. Per kind of group (guided, plain) and steps left to the policy (the plan's
length less the oracle's steps, from the built-in suite of seed N): the groups, those
with mixed rewards (the only ones M-GRPO learns from), the episodes solved, and the
episodes that answered at their first turn of their own (an exit where the plan had an
action left: the early answer that keeps long tasks from being solved).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from bench.common import format_table
from runtime.store import iter_groups
from sites.builtin import plan_length
from sites.builtin.suite import generate_suite


def rows(run: Path, seed: int) -> list[list[object]]:
    """One row per (kind, steps left): groups, mixed, solved / episodes, answered at once."""
    suite = generate_suite(seed)
    lengths = {task.task_id: plan_length(task) for tasks in suite.values() for task in tasks}
    # (kind, left) -> [groups, mixed, solved, episodes, answered at the first own turn]
    books: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for group in iter_groups(run):
        steps = lengths.get(group.task_id)
        if steps is None:
            continue
        book = books["guided" if group.guide else "plain", steps - group.guide]
        book[0] += 1
        book[1] += group.rewards_differ()
        for trajectory in group.trajectories:
            book[2] += trajectory.reward > 0
            book[3] += 1
            own = [turn for turn in trajectory.turns if turn.completion_token_ids]
            first = own[0].action if own else None
            book[4] += steps - group.guide > 1 and first is not None and first.kind == "exit"
    return [
        [kind, left, g, m, f"{s}/{e}", f"{a}/{e}" if left > 1 else "-"]
        for (kind, left), (g, m, s, e, a) in sorted(books.items())
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.guided", description=__doc__)
    parser.add_argument("run", type=Path, help="a training run's directory (or its store)")
    parser.add_argument("--builtin-seed", type=int, default=0, help="the built-in suite's seed")
    args = parser.parse_args(argv)
    headers = ["kind", "steps left", "groups", "mixed", "solved", "answered at once"]
    print(format_table(headers, rows(args.run, args.builtin_seed), title=str(args.run)))


if __name__ == "__main__":
    main()
