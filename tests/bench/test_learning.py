"""bench/learning.py and learning_stages.py: their pure helpers (statistics, curves,
configs, the time estimate)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from bench import learning, learning_stages, learning_stats
from runtime.base.config import load_config


def test_success_stats_pools_episodes_and_seeds() -> None:
    stats = learning_stats.success_stats([(30, 100), (50, 100), (40, 100)])
    assert stats["episodes"] == 300 and stats["successes"] == 120
    assert stats["success"] == pytest.approx(0.4)
    assert stats["se"] == pytest.approx(math.sqrt(0.4 * 0.6 / 300))
    assert stats["per_seed"] == [0.3, 0.5, 0.4]
    assert stats["se_seeds"] == pytest.approx(0.1 / math.sqrt(3))
    one = learning_stats.success_stats([(3, 10)])
    assert one["success"] == pytest.approx(0.3) and math.isnan(one["se_seeds"])
    none = learning_stats.success_stats([])
    assert none["episodes"] == 0 and math.isnan(none["success"])


def test_newest_adapter_needs_a_manifest(tmp_path: Path) -> None:
    assert learning_stats.newest_adapter(tmp_path / "missing") is None
    for version, manifest in ((0, True), (2, True), (10, True), (11, False)):
        folder = tmp_path / f"policy@v{version}"
        folder.mkdir()
        if manifest:
            (folder / "manifest.json").write_text("{}")
    (tmp_path / ".policy@v12.tmp-x").mkdir()
    assert learning_stats.newest_adapter(tmp_path) == (10, tmp_path / "policy@v10")


def test_read_jsonl_skips_only_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n{"a": ')
    assert learning_stats.read_jsonl(path) == [{"a": 1}, {"a": 2}]
    path.write_text('{"a": \n{"a": 2}\n')
    with pytest.raises(json.JSONDecodeError):
        learning_stats.read_jsonl(path)
    assert learning_stats.read_jsonl(tmp_path / "none.jsonl") == []


def test_curves_bin_groups_between_updates() -> None:
    events = [
        {"event": "AdapterPublished", "at": 100.0, "version": 0},
        {"event": "GroupReady", "at": 110.0, "rewards": [0.0, 1.0, 0.0, 0.0]},
        {"event": "GroupReady", "at": 115.0, "rewards": [0.0, 0.0, 0.0, 0.0]},
        {
            "event": "UpdateApplied",
            "at": 160.0,
            "groups_trained": 1,
            "groups_zero_variance": 1,
            "metrics": {"loss": 0.5, "clip_fraction": 0.1, "approx_kl": 0.01, "tokens": 9.0},
        },
        {"event": "GroupReady", "at": 170.0, "rewards": [1.0, 1.0, 0.0, 1.0]},
    ]
    found = learning_stats.curves(events)
    assert found["groups"] == 3 and found["mixed_groups"] == 2
    first, second = found["intervals"]
    assert (first["update"], first["groups"], first["mixed"]) == (0, 2, 1)
    assert first["reward_mean"] == pytest.approx(1 / 8)
    assert first["mixed_fraction"] == pytest.approx(0.5)
    assert (second["update"], second["reward_mean"], second["mixed_fraction"]) == (1, 0.75, 1.0)
    (update,) = found["updates"]
    assert update["update"] == 1 and update["minutes"] == pytest.approx(1.0)
    assert update["clip_fraction"] == 0.1 and "tokens" not in update


def test_curves_of_a_run_without_updates_or_groups() -> None:
    assert learning_stats.curves([]) == {
        "intervals": [],
        "updates": [],
        "groups": 0,
        "mixed_groups": 0,
    }
    found = learning_stats.curves([{"event": "GroupReady", "at": 1.0, "rewards": [0.0, 0.0]}])
    assert found["updates"] == [] and found["intervals"][0]["mixed_fraction"] == 0.0


def test_configs_are_valid_for_the_product(tmp_path: Path) -> None:
    settings = {
        "group_size": 4,
        "groups_in_flight": 2,
        "batch_groups": 2,
        "train_max_turns": 10,
        "lr": 3e-4,
        "optimizer_steps": 2,
        "minibatches": 3,
        "threads": 1,
        "seed": 0,
        "max_updates": 0,
        "temperature": 0.5,
        "server_threads": 2,
        "curriculum": "signal",
        "signal_ceiling": 0.5,
    }
    rl = tmp_path / "rl.toml"
    rl.write_text(
        learning_stages.rl_toml(model=tmp_path / "bc", run_dir=tmp_path / "r",
                                data_dir=tmp_path / "d", settings=settings)
    )  # fmt: skip
    config = load_config(rl)
    assert config.policy.model == str(tmp_path / "bc")
    assert config.scheduler.group_size == 4 and config.scheduler.max_episodes_in_flight == 8
    assert config.learner.learning_rate == pytest.approx(3e-4)
    assert config.learner.optimizer_steps == 2 and config.learner.minibatches == 3
    assert config.policy.temperature == 0.5  # the rollouts' and so the learner's
    assert config.policy.cpu_threads == 2
    assert config.scheduler.curriculum == "signal" and config.scheduler.signal_ceiling == 0.5
    assert config.daemon.eval_every == 0 and not config.endpoint.enabled
    assert config.learner.algorithm == "mgrpo"
    rl.write_text(
        learning_stages.rl_toml(model=tmp_path / "bc", run_dir=tmp_path / "r",
                                data_dir=tmp_path / "d",
                                settings={**settings, "algorithm": "webrl"})
    )  # fmt: skip
    assert load_config(rl).learner.algorithm == "webrl"
    assert config.learner.kl_beta == 0.0 and config.learner.bc_coef == 0.0  # not asked for
    demos = tmp_path / "demos.jsonl"
    term = {"kl_beta": 0.05, "bc_coef": 1.0, "bc_turns": 32, "bc_demos": demos}
    rl.write_text(
        learning_stages.rl_toml(model=tmp_path / "bc", run_dir=tmp_path / "r",
                                data_dir=tmp_path / "d", settings={**settings, **term})
    )  # fmt: skip
    learner = load_config(rl).learner
    assert learner.kl_beta == 0.05 and learner.bc_coef == 1.0 and learner.bc_turns == 32
    assert learner.bc_demos == str(demos)
    # The bench gives the BC term to bc+rl alone: WebRL's config refuses one.
    bc_term = {"bc_coef": 1.0, "bc_turns": 32, "bc_demos": demos}
    for arm, coef in (("bc+rl", 1.0), ("webrl", 0.0), ("r1-zero", 0.0)):
        rl.write_text(
            learning_stages.rl_toml(model=tmp_path / "bc", run_dir=tmp_path / "r",
                                    data_dir=tmp_path / "d",
                                    settings=learning.arm_settings(
                                        arm, {**settings, "kl_beta": 0.05}, bc_term))
        )  # fmt: skip
        learner = load_config(rl).learner
        assert learner.bc_coef == coef and learner.kl_beta == 0.05, arm
        assert learner.algorithm == ("webrl" if arm == "webrl" else "mgrpo")
    ev = tmp_path / "eval.toml"
    ev.write_text(
        learning_stages.eval_toml(model=tmp_path / "bc", url="http://127.0.0.1:1",
                                  run_dir=tmp_path, data_dir=tmp_path)
    )  # fmt: skip
    config = load_config(ev)
    assert config.policy.temperature == 0.0 and config.policy.url == "http://127.0.0.1:1"


def test_planned_calls_and_episodes_and_estimate() -> None:
    plan = learning.planned(
        seeds=3, eval_tasks=100, scaling_tasks=50, scaling_turns=[5, 10, 15, 20, 30], turns=15
    )
    # headline: 3 seeds x (100 test + 100 ood) in 6 calls; scaling: 5 settings x 50 (15 is
    # not shared: the headline ran 100 tasks, the scaling 50).
    assert plan == {
        "bc": (11, 600 + 250),
        "bc+rl": (11, 600 + 250),
        "webrl": (6, 600),
        "control": (6, 600),
        "r1-zero": (6, 600),
    }
    shared = learning.planned(
        seeds=1, eval_tasks=300, scaling_tasks=300, scaling_turns=[5, 15], turns=15
    )
    assert shared["bc"] == (3, 219 + 120 + 219)  # ood has 120 tasks; T=15 reused
    minutes = learning.estimate_minutes(
        bc_minutes=15, rl_minutes=20, rl_overhead_s=60, server_start_s=30, call_overhead_s=10,
        s_per_episode={"bc": 0.6, "r1-zero": 1.2}, plan={"bc": (2, 100), "r1-zero": (1, 50)},
    )  # fmt: skip
    # BC, three training stretches (RL, RL, control) with their overheads, three servers
    assert minutes == pytest.approx(15 + 60 + (180 + 90 + 20 + 60 + 10 + 60) / 60)
    four = learning.estimate_minutes(
        bc_minutes=15, rl_minutes=20, rl_overhead_s=60, server_start_s=30, call_overhead_s=10,
        s_per_episode={"bc": 0.6}, plan={"bc": (2, 100)}, rl_stages=4,
    )  # fmt: skip
    assert four == pytest.approx(15 + 80 + (240 + 90 + 20 + 60) / 60)  # + the WebRL arm


def test_parse_turns() -> None:
    assert learning._parse_turns("15,5, 10,5") == [5, 10, 15]
    for bad in ("a,b", "", "0,5"):
        with pytest.raises(argparse.ArgumentTypeError):
            learning._parse_turns(bad)


def test_parse_arms_keeps_the_order_and_what_the_control_needs() -> None:
    assert learning._parse_arms("r1-zero,bc") == ["bc", "r1-zero"]
    assert learning._parse_arms("control") == ["bc+rl", "control"]  # its budget is RL's time
    for bad in ("", "bc,sft"):
        with pytest.raises(argparse.ArgumentTypeError):
            learning._parse_arms(bad)


def test_bc_summary_totals_the_bc_runs_a_checkpoint_continued(tmp_path: Path) -> None:
    def bc(name: str, base: Path, steps: int, wall_s: float) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        report = {"base_model": str(base), "steps": steps, "wall_s": wall_s, "history": [1]}
        (folder / "bc.json").write_text(json.dumps(report))
        return folder

    pretrained = tmp_path / "smollm2"
    pretrained.mkdir()  # no bc.json: where the chain ends
    first = bc("first", pretrained, 278, 2762.0)
    second = bc("second", first, 140, 1557.0)
    report = learning_stages.bc_summary(second)
    assert "history" not in report
    assert (report["steps"], report["total_steps"]) == (140, 418)
    assert report["total_wall_s"] == pytest.approx(4319.0)
    assert learning_stages.bc_summary(first)["total_steps"] == 278


def test_paired_difference_counts_tasks_only_one_arm_solved() -> None:
    a = {(0, 1): 1.0, (0, 2): 1.0, (0, 3): 0.0, (0, 4): 1.0, (1, 1): 1.0, (0, 9): 1.0}
    b = {(0, 1): 1.0, (0, 2): 0.0, (0, 3): 0.0, (0, 4): 0.0, (1, 1): 0.0, (0, 8): 1.0}
    got = learning_stats.paired_difference(a, b)
    # 5 shared tasks: differences 0, 1, 0, 1, 1 (task 9 and task 8 are not shared)
    assert (got["tasks"], got["only_a"], got["only_b"]) == (5, 3, 0)
    assert got["difference"] == pytest.approx(0.6)
    assert got["se"] == pytest.approx(math.sqrt(0.3) / math.sqrt(5))  # sample variance 0.3
    assert got["sign_p"] == pytest.approx(2 / 8)  # 3 of 3 one way: 2 x (1/2)^3
    even = learning_stats.paired_difference({(0, 1): 1.0, (0, 2): 0.0}, {(0, 1): 0.0, (0, 2): 1.0})
    assert (even["difference"], even["sign_p"]) == (0.0, 1.0)
    same = learning_stats.paired_difference({(0, 1): 1.0, (0, 2): 1.0}, {(0, 1): 1.0, (0, 2): 1.0})
    assert (same["se"], same["sign_p"], same["only_a"]) == (0.0, 1.0, 0)
    assert learning_stats.paired_difference({}, {})["tasks"] == 0


def test_clustered_se_groups_tasks_and_is_the_paired_error_with_one_task_a_cluster() -> None:
    a = {1: 1.0, 2: 0.0, 3: 1.0, 4: 1.0, 5: 1.0}
    b = {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0, 5: 1.0}
    singles = learning_stats.clustered_se(a, b, {k: k for k in a})
    paired = learning_stats.paired_difference({(0, k): v for k, v in a.items()},
                                              {(0, k): v for k, v in b.items()})  # fmt: skip
    assert singles["clusters"] == 5
    assert singles["se"] == pytest.approx(paired["se"])
    # Tasks 1, 3, 4 of one template (all +1), 2 and 5 of another (0): mean 0.6,
    # residual sums 3 * 0.4 = 1.2 and 2 * -0.6 = -1.2: sqrt(2 * 2.88) / 5.
    grouped = learning_stats.clustered_se(a, b, {1: "x", 3: "x", 4: "x", 2: "y", 5: "y"})
    assert grouped["se"] == pytest.approx(math.sqrt(2 * 2.88) / 5) and grouped["clusters"] == 2
    # Only tasks both arms ran and the map names count; one cluster has no error.
    assert learning_stats.clustered_se(a, b, {1: "x", 9: "y"})["tasks"] == 1
    assert math.isnan(learning_stats.clustered_se(a, b, {1: "x", 3: "x"})["se"])


def _episode(reward: float, status: str = "exited", unjudged: bool = False) -> dict[str, object]:
    return {"status": status, "reward": reward, "unjudged": unjudged}


def test_task_rates_leave_out_unjudged_and_infrastructure_errors(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    rows = [
        {"task_id": 1, "episodes": [_episode(1.0), _episode(0.0, "max_turns")]},
        {"task_id": 2, "episodes": [_episode(0.0, unjudged=True)]},
        {"task_id": 3, "episodes": [_episode(1.0), _episode(0.0, unjudged=True), _episode(0.0)]},
        {"task_id": 4, "episodes": [{"status": "exited", "reward": 0.0}]},  # no `unjudged`
        # A policy timeout is not a failure of the policy: left out, not counted as 0.
        {"task_id": 5, "episodes": [_episode(0.0, "error:policy"), _episode(1.0)]},
        {"task_id": 6, "episodes": [_episode(0.0, "error:browser")]},
        {"task_id": 7, "episodes": [_episode(0.0, "interrupted")]},  # a stop's drain
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert learning_stats.task_rates(path) == {1: 0.5, 3: 0.5, 4: 0.0, 5: 1.0}


def test_paired_pairs_the_arms_that_ran_per_split(tmp_path: Path) -> None:
    from types import SimpleNamespace

    def run(name: str, solved: dict[int, int]) -> str:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "results.jsonl").write_text("".join(
            json.dumps({"task_id": t, "episodes": [_episode(float(s))],
                        "intent_template_id": 100 + t % 2}) + "\n"
            for t, s in solved.items()
        ))  # fmt: skip
        return str(folder)

    evals: dict[str, list[dict[str, object]]] = {arm: [] for arm in learning.ARMS}
    evals["bc"] = [{"split": "test", "seed": 0, "out": run("bc-t", {1: 0, 2: 0, 3: 1})},
                   {"split": "ood", "seed": 0, "out": run("bc-o", {7: 0})}]  # fmt: skip
    evals["webrl"] = [{"split": "test", "seed": 0, "out": run("w-t", {1: 1, 2: 1, 3: 1})},
                      {"split": "ood", "seed": 0, "out": run("w-o", {7: 0})}]  # fmt: skip
    exp = SimpleNamespace(args=SimpleNamespace(arms=["bc", "webrl"]), evals=evals)
    got = learning._paired(exp)  # type: ignore[arg-type]
    assert [(c["a"], c["b"], c["split"]) for c in got] == [
        ("webrl", "bc", "test"), ("webrl", "bc", "ood"),
    ]  # fmt: skip
    assert (got[0]["only_a"], got[0]["difference"]) == (2, pytest.approx(2 / 3))
    assert (got[1]["tasks"], got[1]["difference"]) == (1, 0.0)
    # Tasks 1 and 3 of template 101 (differences 1, 0), task 2 of 100 (1); mean 2/3, so the
    # residual sums are -1/3 and +1/3.
    expected = learning_stats.clustered_se({1: 1.0, 2: 1.0, 3: 1.0}, {1: 0.0, 2: 0.0, 3: 1.0},
                                           {1: 101, 3: 101, 2: 100})  # fmt: skip
    assert got[0]["template_se"] == pytest.approx(expected["se"])
    assert expected["se"] == pytest.approx(math.sqrt(2 * 2 * (1 / 3) ** 2) / 3)
    assert math.isnan(got[1]["template_se"])  # one template: no error


def test_reused_run_reads_an_earlier_arm(tmp_path: Path) -> None:
    run = tmp_path / "bc+rl"
    for version in (0, 1):
        (run / "learner" / "adapters" / f"policy@v{version}").mkdir(parents=True)
        (run / "learner" / "adapters" / f"policy@v{version}" / "manifest.json").write_text("{}")
    events = [
        {"event": "AdapterPublished", "at": 1000.0, "version": 0},
        {"event": "GroupReady", "at": 1100.0, "rewards": [0.0, 1.0]},
        {"event": "UpdateApplied", "at": 1300.0, "metrics": {"loss": 0.1}},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    # the daemon's log: told to stop 900 s after v0 (1970-01-01T00:31:40Z is 1900.0)
    log = [{"event": "daemon.starting"}, {"event": "daemon.stopping",
                                          "timestamp": "1970-01-01T00:31:40.000000Z"}]  # fmt: skip
    run.with_suffix(".log").write_text("".join(json.dumps(e) + "\n" for e in log))
    got = learning_stages.reused_run(run)
    assert (got["version"], got["adapter"], got["train_s"]) == (
        1, str(run / "learner" / "adapters" / "policy@v1"), 900.0,
    )  # fmt: skip
    assert got["curves"]["groups"] == 1 and len(got["curves"]["updates"]) == 1
    run.with_suffix(".log").write_text(json.dumps(log[0]) + "\n")
    with pytest.raises(SystemExit, match=r"records no daemon\.stopping"):
        learning_stages.reused_run(run)
    with pytest.raises(SystemExit, match="no adapter with a manifest"):
        learning_stages.reused_run(tmp_path / "missing")
    assert learning._parse_reuse("webrl=/x/y") == ("webrl", Path("/x/y"))
    for bad in ("bc=/x", "webrl=", "webrl"):
        with pytest.raises(argparse.ArgumentTypeError):
            learning._parse_reuse(bad)
