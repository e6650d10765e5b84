"""bench/compare.py: evaluations compared task by task against the first."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import compare


def _eval(folder: Path, outcomes: dict[int, str], templates: dict[int, int] | None = None) -> Path:
    """A `webagent eval --out` folder: task id -> "won", "lost" or "error" (a policy
    timeout, which says nothing of the policy); `templates` names the lines' templates."""
    folder.mkdir()
    episode = {
        "won": {"status": "exited", "reward": 1.0, "unjudged": False},
        "lost": {"status": "exited", "reward": 0.0, "unjudged": False},
        "error": {"status": "error:policy", "reward": 0.0, "unjudged": False},
    }
    rows = [
        {"task_id": t, "episodes": [episode[o]], "intent_template_id": (templates or {}).get(t)}
        for t, o in outcomes.items()
    ]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_runs_are_paired_with_the_base_on_the_tasks_both_scored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _eval(tmp_path / "bc", {1: "won", 2: "won", 3: "lost", 4: "lost", 5: "lost"})
    # Gains 3 and 4, loses 1; task 5 timed out (left out of the pair); task 6 the base never ran.
    rl = _eval(tmp_path / "rl", {1: "lost", 2: "won", 3: "won", 4: "won", 5: "error", 6: "won"})
    rows = compare.compare([compare._results(str(base)), compare._results(f"arm={rl}")])
    assert [r["run"] for r in rows] == ["bc", "arm"]
    first, arm = rows
    assert (first["difference"], first["only_a"], first["only_b"]) == (0.0, 0, 0)
    assert (arm["scored"], arm["solved"], arm["tasks"]) == (5, 4, 4)  # 6 scored, not paired
    assert math.isnan(arm["template_se"])
    # Paired over tasks 1-4: differences -1, 0, +1, +1.
    assert arm["difference"] == pytest.approx(0.25)
    assert arm["se"] == pytest.approx(math.sqrt(11 / 12) / 2)  # sample variance 11/12, n 4
    assert (arm["only_a"], arm["only_b"], arm["gained"], arm["lost"]) == (2, 1, [3, 4], [1])
    assert compare.main([str(base), f"arm={rl}", "--ids"]) == 0
    printed = capsys.readouterr().out
    assert "+25.0 ± 47.9" in printed and "arm: gained [3, 4] lost [1]" in printed
    assert "n/a" in printed  # no line names its template: no error by template


def test_the_error_by_template_groups_the_tasks_of_one_template(tmp_path: Path) -> None:
    # Tasks 1-2 of template 10, 3-4 of template 20; differences -1, 0 and +1, +1.
    templates = {1: 10, 2: 10, 3: 20, 4: 20}
    base = _eval(tmp_path / "bc", {1: "won", 2: "won", 3: "lost", 4: "lost"}, templates)
    rl = _eval(tmp_path / "rl", {1: "lost", 2: "won", 3: "won", 4: "won"})  # older: no templates
    arm = compare.compare([compare._results(str(base)), compare._results(str(rl))])[1]
    # Mean 0.25; residual sums per template -1.5 and +1.5: sqrt(2/1 * 4.5) / 4 tasks.
    assert arm["template_se"] == pytest.approx(0.75)
    assert arm["se"] == pytest.approx(math.sqrt(11 / 12) / 2)  # the paired error, as before
    # A task whose template is unknown leaves the error by template undefined, not partial.
    five = {1: "won", 2: "won", 3: "lost", 4: "lost", 5: "won"}
    partial = _eval(tmp_path / "partial", five, templates)
    rl5 = _eval(tmp_path / "rl5", {1: "lost", 2: "won", 3: "won", 4: "won", 5: "won"})
    rows = compare.compare([compare._results(str(partial)), compare._results(str(rl5))])
    assert math.isnan(rows[1]["template_se"])
    # Templates from the built-in suite for results that name none.
    suite = compare.builtin_templates(0)
    assert len(suite) == 219 + 120 + 1427 and all(isinstance(t, int) for t in suite.values())


def test_runs_of_one_name_are_seeds_of_one_arm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _eval(tmp_path / "bc", {1: "won", 2: "lost", 3: "lost", 4: "lost"})
    # Three seeds of arm "rl": +2, 0 and +1 tasks of 4 (+50, 0, +25 points); "one" is alone.
    seed1 = _eval(tmp_path / "s1", {1: "won", 2: "won", 3: "won", 4: "lost"})
    seed2 = _eval(tmp_path / "s2", {1: "won", 2: "lost", 3: "lost", 4: "lost"})
    seed3 = _eval(tmp_path / "s3", {1: "lost", 2: "won", 3: "won", 4: "lost"})
    one = _eval(tmp_path / "one", {1: "lost", 2: "lost", 3: "lost", 4: "lost"})
    specs = [str(base), f"rl={seed1}", f"one={one}", f"rl={seed2}", f"rl={seed3}"]
    rows = compare.compare([compare._results(spec) for spec in specs])
    (arm,) = compare.over_seeds(rows)
    assert (arm["arm"], arm["seeds"], arm["per_seed"]) == ("rl", 3, [0.5, 0.0, 0.25])
    assert arm["difference"] == pytest.approx(0.25)
    assert arm["success"] == pytest.approx((0.75 + 0.25 + 0.5) / 3)
    assert arm["se_seeds"] == pytest.approx(0.25 / math.sqrt(3))  # stdev of the three: 0.25
    assert compare.main(specs) == 0
    printed = capsys.readouterr().out
    assert "seeds of one arm against bc" in printed and "+50.0 +0.0 +25.0" in printed
    assert compare.over_seeds(rows[:3]) == []  # one run a name: no arm table


def test_a_folder_without_results_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _eval(tmp_path / "bc", {1: "won"})
    with pytest.raises(SystemExit) as exit_:
        compare.main([str(base), str(tmp_path / "missing")])
    assert exit_.value.code == 2
    assert f"no {tmp_path / 'missing' / 'results.jsonl'}" in capsys.readouterr().err


def test_success_is_the_mean_of_the_tasks_rates(tmp_path: Path) -> None:
    folder = tmp_path / "sampled"
    folder.mkdir()
    won = {"status": "exited", "reward": 1.0, "unjudged": False}
    lost = {"status": "exited", "reward": 0.0, "unjudged": False}
    rows = [{"task_id": 1, "episodes": [won, lost, lost, lost]}, {"task_id": 2, "episodes": [won]}]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    row = compare.compare([compare._results(str(folder))])[0]
    assert (row["solved"], row["success"]) == (2, pytest.approx((0.25 + 1.0) / 2))


def test_tasks_are_split_by_the_length_of_their_plan(tmp_path: Path) -> None:
    folder = tmp_path / "eval"
    folder.mkdir()

    def line(task: int, status: str, reward: float, turns: int) -> str:
        episode = {"status": status, "reward": reward, "unjudged": False, "turns": turns}
        return json.dumps({"task_id": task, "episodes": [episode]}) + "\n"

    lines = [
        line(1, "exited", 1.0, 2),  # plan 2, solved
        line(2, "exited", 0.0, 2),  # plan 4, answered after 2 turns: early
        line(3, "max_turns", 0.0, 15),  # plan 6, ran out
        line(4, "exited", 1.0, 4),  # plan 4, solved
        line(5, "repeated_actions", 0.0, 3),  # plan 5, ran out (the repeat guard)
        line(6, "error:policy", 0.0, 1),  # plan 5, not scored: left out
        line(7, "exited", 0.0, 1),  # no known plan: left out
    ]
    (folder / "results.jsonl").write_text("".join(lines))
    lengths = {1: 2, 2: 4, 3: 6, 4: 4, 5: 5, 6: 5}
    (row,) = compare.by_plan_length([("rl", folder / "results.jsonl")], lengths)
    assert (row["solved"], row["tasks"]) == ([1, 1, 0], [1, 2, 2])
    assert (row["episodes"], row["early"], row["ran_out"]) == (5, 1, 2)
    headers, table = compare._plan_table([row])
    assert headers[1:4] == ["1-3 steps", "4 steps", "5+ steps"]
    assert table == [["rl", "1/1", "1/2", "0/2", 5, 1, 2]]
    # The built-in suite's plans: every task of seed 0, none shorter than one step (the exit).
    suite = compare.builtin_plan_lengths(0)
    assert len(suite) == 219 + 120 + 1427 and min(suite.values()) >= 1
