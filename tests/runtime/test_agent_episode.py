"""An endpoint run that names an adapter is answered by that version alone: every request
of the run carries it (the whole run is driven through real Chromium in
tests/runtime/test_daemon.py)."""

from __future__ import annotations

import pytest

from runtime.agent_episode import Pinned
from runtime.base.messages import ChatMessage, PolicyReply, PolicyRequest, TaskConfig

pytestmark = pytest.mark.anyio


class _Recorder:
    def __init__(self) -> None:
        self.requests: list[PolicyRequest] = []

    async def act(self, request: PolicyRequest) -> PolicyReply:
        self.requests.append(request)
        return PolicyReply(text="<answer>exit()</answer>", adapter=request.adapter or "")


async def test_a_pinned_policy_names_its_adapter_in_every_request() -> None:
    inner = _Recorder()
    pinned = Pinned(inner, "policy@v3")
    task = TaskConfig(task_id=-1, intent="x", start_url="http://127.0.0.1:1/")
    for turn, asked in enumerate([None, "policy@v9"]):
        request = PolicyRequest(
            episode_id="run", turn=turn, task=task,
            messages=[ChatMessage(role="user", content="Round 0")], adapter=asked,
        )  # fmt: skip
        reply = await pinned.act(request)
        assert reply.adapter == "policy@v3"
    assert [r.adapter for r in inner.requests] == ["policy@v3", "policy@v3"]
    assert [r.turn for r in inner.requests] == [0, 1]  # the rest of each request unchanged
