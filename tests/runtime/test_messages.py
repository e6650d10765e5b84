from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from runtime.base.messages import (
    Action,
    AdapterPublished,
    AdapterSwapped,
    EpisodeFinished,
    EpisodeStarted,
    Event,
    Fault,
    GroupReady,
    TaskConfig,
    Trajectory,
    TrajectoryGroup,
    Turn,
    TurnTaken,
    TurnTimings,
    UpdateApplied,
    decode,
    decode_event,
    decode_group,
    decode_task,
    decode_tasks,
    encode,
    encode_task,
    encode_tasks,
)

WEBARENA_TASK: dict[str, Any] = {
    "sites": ["shopping_admin"],
    "task_id": 0,
    "require_login": True,
    "storage_state": "./.auth/shopping_admin_state.json",
    "start_url": "__SHOPPING_ADMIN__",
    "geolocation": None,
    "intent_template": "What is the top-{{n}} best-selling product in {{year}}",
    "instantiation_dict": {"n": 1, "year": 2022},
    "intent": "What is the top-1 best-selling product in 2022",
    "require_reset": False,
    "eval": {
        "eval_types": ["string_match"],
        "reference_answers": {"exact_match": "Quest Lumaflex\u2122 Band"},
        "reference_url": "",
        "program_html": [],
        "string_note": "",
        "reference_answer_raw_annotation": "Quest Lumaflex\u2122 Band",
    },
    "intent_template_id": 279,
}


def _group() -> TrajectoryGroup:
    turn = Turn(
        index=0,
        url="http://127.0.0.1:1/",
        observation='<button id="3">Go</button>',
        observation_digest="abc",
        text='<think>t</think><answer>do(action="Click", element="3")</answer>',
        thought="t",
        action=Action(kind="do", name="Click", element=3),
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=[4, 5],
        completion_logprobs=[-0.5, -0.25],
        adapter="policy@v2",
        adapter_version=2,
        timings=TurnTimings(observe_s=0.1, policy_s=0.2, act_s=0.3),
    )
    bad = Turn(
        index=1,
        url="u",
        observation="o",
        observation_digest="d",
        text="???",
        parse_error="no <answer> block",
    )
    traj = Trajectory(
        episode_id="e1",
        group_id="g1",
        task_id=7,
        intent="buy",
        turns=[turn, bad],
        answer=None,
        reward=1.0,
        status="max_turns",
        adapter_versions=[2],
    )
    return TrajectoryGroup(group_id="g1", task_id=7, trajectories=[traj, traj], created_at=1.5)


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_group_round_trip(fmt: str) -> None:
    group = _group()
    data = encode(group, format=fmt)  # type: ignore[arg-type]
    assert decode_group(data, format=fmt) == group  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_a_lone_surrogate_is_written_as_a_replacement_character(fmt: str) -> None:
    group = _group()
    turn = msgspec.structs.replace(
        group.trajectories[0].turns[1],
        observation="page \ud800 text \U0001f600",
        action_error="no element \udc00",
    )
    trajectory = msgspec.structs.replace(group.trajectories[0], turns=[turn])
    hostile = msgspec.structs.replace(group, trajectories=[trajectory])
    back = decode_group(encode(hostile, format=fmt), format=fmt)  # type: ignore[arg-type]
    kept = back.trajectories[0].turns[0]
    assert kept.observation == "page \ufffd text \U0001f600"
    assert kept.action_error == "no element \ufffd"
    assert back.trajectories[0].episode_id == "e1" and back.task_id == 7


@pytest.mark.parametrize(
    ("outcomes", "differ"),
    [
        ([(1.0, "exited"), (0.0, "max_turns")], True),
        ([(1.0, "exited"), (1.0, "exited"), (1.0, "repeated_actions")], False),
        ([(0.0, "exited")], False),  # a group of one
        # an infrastructure failure's reward says nothing: this group cannot teach
        ([(1.0, "exited"), (0.0, "error:browser"), (0.0, "interrupted")], False),
        ([(0.0, "parse_failures"), (0.0, "error:browser"), (1.0, "exited")], True),
    ],
)
def test_rewards_differ_counts_only_evaluated_trajectories(
    outcomes: list[tuple[float, str]], differ: bool
) -> None:
    trajectories = [
        Trajectory(episode_id=f"e{i}", group_id="g", task_id=1, intent="x", reward=r, status=s)  # type: ignore[arg-type]
        for i, (r, s) in enumerate(outcomes)
    ]
    group = TrajectoryGroup(group_id="g", task_id=1, trajectories=trajectories, created_at=0.0)
    assert group.rewards_differ() is differ


EVENTS: list[Event] = [
    EpisodeStarted(at=1.0, episode_id="e", group_id="g", task_id=1),
    TurnTaken(at=1.0, episode_id="e", index=0, action="go_backward()", error="blocked"),
    EpisodeFinished(
        at=2.0, episode_id="e", group_id="g", task_id=1, status="exited", reward=1.0, turns=3
    ),
    GroupReady(at=3.0, group_id="g", task_id=1, rewards=[0.0, 1.0]),
    UpdateApplied(at=4.0, version=3, step=9, groups_trained=2, metrics={"loss": 0.1}),
    AdapterPublished(at=5.0, version=3, name="policy@v3", path="/x"),
    AdapterSwapped(at=6.0, name="policy@v3", previous="policy@v2", latency_s=0.02),
    Fault(at=7.0, kind="browser", message="Target crashed"),
]


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_event_round_trip_is_tagged(fmt: str, event: Event) -> None:
    data = encode(event, format=fmt)  # type: ignore[arg-type]
    back = decode_event(data, format=fmt)  # type: ignore[arg-type]
    assert back == event
    assert type(back) is type(event)
    if fmt == "json":
        assert json.loads(data)["event"] == type(event).__name__


def test_unknown_event_tag_is_rejected() -> None:
    with pytest.raises(msgspec.ValidationError, match="Invalid value 'Nope'"):
        decode_event(b'{"event": "Nope", "at": 1}')


def test_webarena_task_round_trips_exactly() -> None:
    task = decode_task(WEBARENA_TASK)
    assert task.task_id == 0
    assert task.eval.reference_answers is not None
    assert task.eval.reference_answers.exact_match == "Quest Lumaflex\u2122 Band"  # type: ignore[union-attr]
    assert encode_task(task) == WEBARENA_TASK


def test_unknown_fields_survive_at_every_level() -> None:
    raw = json.loads(json.dumps(WEBARENA_TASK))
    raw["annotator"] = {"name": "x", "minutes": 3}
    raw["eval"]["grader_version"] = 2
    raw["eval"]["reference_answers"] = {"must_include": ["0"], "weird_rule": [1]}
    raw["eval"]["program_html"] = [
        {"url": "last", "locator": "", "required_contents": {"must_include": ["a"]}, "z": 1}
    ]
    del raw["geolocation"]  # absent fields stay absent
    sorted_input = json.dumps([raw], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    tasks = decode_tasks(sorted_input)
    assert tasks[0].extra_fields == {"annotator": {"name": "x", "minutes": 3}}
    assert tasks[0].eval.extra_fields == {"grader_version": 2}
    assert encode_tasks(tasks).decode() == sorted_input
    # and again: stable under repeated round trips
    assert encode_tasks(decode_tasks(encode_tasks(tasks))).decode() == sorted_input


def test_task_with_wrong_type_names_field() -> None:
    raw = dict(WEBARENA_TASK, task_id="zero")
    with pytest.raises(msgspec.ValidationError, match=r"\$\.task_id"):
        decode_task(raw)


def test_generic_decode_reuses_decoders() -> None:
    data = encode([_group()])
    assert decode(data, list[TrajectoryGroup]) == [_group()]
    assert isinstance(
        decode(encode(TaskConfig(task_id=1, intent="i", start_url="u")), TaskConfig), TaskConfig
    )
