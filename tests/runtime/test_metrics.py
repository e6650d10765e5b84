from __future__ import annotations

from pathlib import Path

import pytest

from runtime.base.messages import (
    AdapterPublished,
    AdapterSwapped,
    EpisodeFinished,
    EvalFinished,
    Fault,
    GroupReady,
    UpdateApplied,
)
from runtime.metrics import MetricsBook, plot_learning_curve, read_events
from runtime.scheduler import SchedulerStatistics
from runtime.supervisor import ServerState


def _events() -> list:  # type: ignore[type-arg]
    out = []
    for version in range(1, 4):
        for i in range(4):
            out.append(
                EpisodeFinished(
                    at=0,
                    episode_id=f"e{version}{i}",
                    group_id="g",
                    task_id=1,
                    status="exited",
                    reward=float(i % 2),
                    turns=2,
                    prompt_tokens=300,
                )
            )
        out.append(GroupReady(at=0, group_id=f"g{version}", task_id=1, rewards=[0, 1, 1, 0]))
        out.append(
            UpdateApplied(
                at=0,
                version=version,
                step=version,
                groups_trained=1,
                groups_stale=1,
                groups_failed=1,
                trajectories_dropped=2,
                metrics={"loss": 0.5},
            )
        )
        out.append(AdapterPublished(at=0, version=version, name=f"policy@v{version}", path="/x"))
        out.append(AdapterSwapped(at=0, name=f"policy@v{version}", previous="p", latency_s=0.02))
        out.append(
            EvalFinished(at=0, split="test", version=version, episodes=8, success=0.1 * version)
        )
    out.append(Fault(at=0, kind="browser", message="crashed"))
    return out


def test_book_folds_events_and_logs_them(tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    book = MetricsBook(path)
    for event in _events():
        book.record(event)
    book.close()
    summary = book.summary()
    assert summary["adapter_version"] == 3
    assert summary["updates"] == 3
    assert summary["recent_success"] == pytest.approx(0.5)
    assert summary["groups"] == {
        "received": 3,
        "trained": 3,
        "stale": 3,
        "zero_variance": 0,
        "failed": 3,
        "trajectories_dropped": 6,
    }
    assert summary["eval_success"] == {"test": pytest.approx(0.3)}
    assert summary["faults"] == {"browser": 1}
    assert read_events(path) == _events()


def test_prometheus_text() -> None:
    book = MetricsBook()
    for event in _events():
        book.record(event)
    text = book.prometheus()
    assert 'webagent_episodes_total{status="exited"} 12' in text
    assert "webagent_updates_total 3" in text
    assert "webagent_adapter_version 3" in text
    assert 'webagent_eval_success{split="test"} 0.3' in text
    assert 'webagent_faults_total{kind="browser"} 1' in text
    for line in text.splitlines():  # every sample line is `name{labels} number`
        if not line.startswith("#"):
            float(line.rsplit(" ", 1)[1])


def test_prometheus_gauges_of_the_server_and_the_scheduler() -> None:
    book = MetricsBook()
    assert "policy_server_up" not in book.prometheus()  # not given: not shown
    server = ServerState(
        state="down", managed=True, url="http://127.0.0.1:1", reason="exited", since=0.0,
        outages=2, restarts=2, recovery_s=[3.0, 4.0],
    )  # fmt: skip
    scheduler = SchedulerStatistics(
        groups_in_flight=2, groups_started=9, groups_finished=7, episodes_waiting=0,
        episodes_in_flight=8, episodes_finished=28, episodes_failed=0, queue_depth=1,
        turns=140, steps_per_s=1.25, episodes_per_s=0.2, epoch=0, paused=False, stopping=False,
    )  # fmt: skip
    text = book.prometheus(server=server, scheduler=scheduler)
    for line in (
        "# TYPE webagent_policy_server_up gauge",
        "webagent_policy_server_up 0",
        "# TYPE webagent_policy_server_restarts_total counter",
        "webagent_policy_server_restarts_total 2",
        "webagent_groups_in_flight 2",
        "webagent_episodes_in_flight 8",
        "webagent_group_queue_depth 1",
        "webagent_steps_per_second 1.25",
    ):
        assert line in text.splitlines()


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    book = MetricsBook(path)
    for event in _events()[:3]:
        book.record(event)
    book.close()
    with path.open("ab") as f:
        f.write(b'{"event":"GroupRe')
    assert len(read_events(path)) == 3


def test_learning_curve_png(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    book = MetricsBook(path)
    for event in _events():
        book.record(event)
    book.close()
    png = tmp_path / "curve.png"
    plot_learning_curve(path, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000
    assert not list(tmp_path.glob("*.tmp.png"))
