"""The terminal progress table reads the learner's live counts."""

from __future__ import annotations

import re

from rich.console import Console

from runtime.progress import render


def _text(status: dict[str, object]) -> str:
    console = Console(width=120, record=True)
    console.print(render(status))
    return console.export_text()


def test_groups_set_aside_show_before_the_first_update() -> None:
    status = {
        "mode": "training",
        "groups": {"received": 41, "trained": 0, "stale": 0, "zero_variance": 0, "failed": 0},
        "learner": {"groups_received": 41, "groups_trained": 0, "groups_zero_variance": 39,
                    "groups_stale": 1, "groups_failed": 1, "step": 0},
    }  # fmt: skip
    text = _text(status)
    assert "41 received: 0 trained, 39 zero-variance, 1 stale, 1 failed" in text


def test_without_a_learner_section_the_event_totals_show() -> None:
    status = {"groups": {"received": 5, "trained": 4, "zero_variance": 1}}
    assert "5 received: 4 trained, 1 zero-variance, 0 stale, 0 failed" in _text(status)


def test_the_policy_server_state_and_the_faults_show() -> None:
    down = {
        "server": {"state": "down", "managed": True, "reason": "vLLM exited with code -9",
                   "outages": 1, "recovery_s": []},
        "faults": {"browser": 2, "policy_server": 1},
    }  # fmt: skip
    text = _text(down)
    assert "DOWN: restarting (vLLM exited with code -9)" in text
    assert "browser 2, policy_server 1" in text
    external = {
        "server": {"state": "down", "managed": False, "reason": "no /health"},
        "scheduler": {"held_for": ["policy"]},
    }
    text = _text(external)
    assert "waiting for it; rollouts paused (no /health)" in text
    assert re.search(r"new turns wait for\W+policy", text)
    assert "new groups wait for" not in text
    learner_behind = {"scheduler": {"waiting_for_learner": True}}
    assert re.search(r"new groups wait for\W+the learner", _text(learner_behind))
    up = {"server": {"state": "up", "outages": 1, "recovery_s": [41.25]}, "faults": {}}
    text = _text(up)
    assert "up (1 outages, last back after 41.2 s)" in text
    assert "none" in text
