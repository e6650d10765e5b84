"""Every piece of data that crosses a boundary: frozen msgspec Structs.

- `TaskConfig` is WebArena's task JSON field for field. Fields a file leaves out stay
  out (`UNSET`), unknown fields are kept in `extra_fields`, so `encode_task(decode_task(x))`
  is `x` again (with sorted keys).
- `ChatMessage`, `PolicyReply`: what the episode sends to a policy and gets back.
- `Action`, `Turn`, `Trajectory`, `TrajectoryGroup`: what a rollout records.
- `Event`: the tagged union that logs, metrics and the control API are derived from.

This module sits at the bottom of the project: it imports nothing of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal, Protocol

import msgspec
from msgspec import UNSET, UnsetType

from runtime.base.text import well_formed_tree

__all__ = [
    "EVALUATED_STATUSES",
    "Action",
    "AdapterManifest",
    "AdapterPublished",
    "AdapterSwapped",
    "ChatMessage",
    "ElementQuery",
    "EpisodeFinished",
    "EpisodeStarted",
    "EvalCheck",
    "EvalFinished",
    "EvalSpec",
    "Evaluation",
    "Event",
    "Fault",
    "GroupReady",
    "OracleStep",
    "PolicyReply",
    "PolicyRequest",
    "ProgramHtmlCheck",
    "ReferenceAnswers",
    "RunRequest",
    "RunState",
    "RunTurn",
    "TaskConfig",
    "Trajectory",
    "TrajectoryGroup",
    "Turn",
    "TurnTaken",
    "TurnTimings",
    "UpdateApplied",
    "decode",
    "decode_event",
    "decode_group",
    "decode_task",
    "decode_tasks",
    "encode",
    "encode_task",
    "encode_tasks",
    "rewards_differ",
]


class _Msg(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every message."""


# --------------------------------------------------------------------------- tasks


class ProgramHtmlCheck(_Msg, frozen=True):
    """One `program_html` entry: go to `url`, run `locator`, check `required_contents`."""

    url: str = "last"
    locator: str = ""
    # {"must_include": [...]}, {"exact_match": "..."}, ... (older files: a bare list).
    required_contents: dict[str, Any] | list[Any] | str | UnsetType = UNSET
    prep_actions: list[str] | UnsetType = UNSET
    extra_fields: dict[str, Any] = {}


class ReferenceAnswers(_Msg, frozen=True):
    """The answers a string_match evaluator compares the agent's exit message with."""

    exact_match: str | int | float | None | UnsetType = UNSET
    # Lists of phrases; WebArena-Lite also writes one phrase as a bare string (task 81).
    must_include: list[str | int | float] | str | int | float | None | UnsetType = UNSET
    must_exclude: list[str | int | float] | str | int | float | None | UnsetType = UNSET
    fuzzy_match: list[str] | str | None | UnsetType = UNSET
    one_of: list[str | int | float] | None | UnsetType = UNSET
    required_values: list[str | int | float] | None | UnsetType = UNSET
    extra_fields: dict[str, Any] = {}


class EvalSpec(_Msg, frozen=True):
    """A task's `eval` object."""

    eval_types: list[str] = []
    reference_answers: ReferenceAnswers | None | UnsetType = UNSET
    reference_url: str | None | UnsetType = UNSET
    url_note: str | None | UnsetType = UNSET
    program_html: list[ProgramHtmlCheck] | None | UnsetType = UNSET
    string_note: str | None | UnsetType = UNSET
    reference_answer_raw_annotation: str | int | float | None | UnsetType = UNSET
    extra_fields: dict[str, Any] = {}


class TaskConfig(_Msg, frozen=True):
    """One WebArena task config, as in `test.raw.json` and WebArena-Lite files."""

    task_id: int
    intent: str
    start_url: str
    sites: list[str] = []
    eval: EvalSpec = EvalSpec()
    require_login: bool | UnsetType = UNSET
    storage_state: str | None | UnsetType = UNSET
    geolocation: Any | UnsetType = UNSET
    intent_template: str | UnsetType = UNSET
    instantiation_dict: dict[str, Any] | UnsetType = UNSET
    require_reset: bool | UnsetType = UNSET
    intent_template_id: int | str | UnsetType = UNSET
    # Not WebArena's: a guided start (`runtime.guided`, training only). The oracle plays
    # the first `guide` steps of the task's scripted solution, the policy the rest.
    guide: int | UnsetType = UNSET
    extra_fields: dict[str, Any] = {}


# Which nested fields hold which Struct, for carrying unknown fields through.
_NESTED: dict[type[_Msg], dict[str, type[_Msg]]] = {
    TaskConfig: {"eval": EvalSpec},
    EvalSpec: {"reference_answers": ReferenceAnswers, "program_html": ProgramHtmlCheck},
    ReferenceAnswers: {},
    ProgramHtmlCheck: {},
}


def _with_extras(raw: Any, cls: type[_Msg]) -> Any:
    """Copy of a raw JSON object with its unknown keys moved under `extra_fields`."""
    if isinstance(raw, list):
        return [_with_extras(item, cls) for item in raw]
    if not isinstance(raw, dict):
        return raw
    known = set(cls.__struct_fields__) - {"extra_fields"}
    nested = _NESTED[cls]
    out: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            extras[key] = value
        elif key in nested:
            out[key] = _with_extras(value, nested[key])
        else:
            out[key] = value
    if extras:
        out["extra_fields"] = extras
    return out


def _without_extras(obj: Any) -> Any:
    """Inverse of `_with_extras` on builtins: unknown keys back in place."""
    if isinstance(obj, list):
        return [_without_extras(item) for item in obj]
    if not isinstance(obj, dict):
        return obj
    out = {key: _without_extras(value) for key, value in obj.items() if key != "extra_fields"}
    out.update(obj.get("extra_fields", {}))
    return out


def decode_task(raw: dict[str, Any]) -> TaskConfig:
    """A task from its decoded JSON object; raises msgspec.ValidationError naming the field."""
    return msgspec.convert(_with_extras(raw, TaskConfig), TaskConfig)


def decode_tasks(data: bytes | str) -> list[TaskConfig]:
    """Tasks from a JSON document holding one task object or a list of them."""
    raw = msgspec.json.decode(data)
    items = raw if isinstance(raw, list) else [raw]
    return [decode_task(item) for item in items]


def encode_task(task: TaskConfig) -> dict[str, Any]:
    """The task as the JSON object it came from (unknown fields included)."""
    result: dict[str, Any] = _without_extras(msgspec.to_builtins(task))
    return result


def encode_tasks(tasks: list[TaskConfig]) -> bytes:
    """Tasks as a JSON list with sorted keys: stable under decode/encode round trips."""
    return msgspec.json.encode([encode_task(t) for t in tasks], order="sorted")


# --------------------------------------------------------------------------- policy


class ChatMessage(_Msg, frozen=True):
    """One chat message of a turn's prompt."""

    role: Literal["system", "user", "assistant"]
    content: str


class PolicyRequest(_Msg, frozen=True):
    """One turn's request to a policy: the rendered chat so far, and whose turn it is.

    `task` is there for scripted policies (the oracle); model policies use `messages` only.
    """

    episode_id: str
    turn: int
    task: TaskConfig
    messages: list[ChatMessage]
    # A served adapter to use ("policy@v3"); None: the version currently published.
    adapter: str | None = None


class PolicyReply(_Msg, frozen=True):
    """What a policy returns for one turn; token fields are empty for scripted policies."""

    text: str
    prompt_token_ids: list[int] = []
    completion_token_ids: list[int] = []
    completion_logprobs: list[float] = []
    adapter: str = ""
    adapter_version: int = -1
    finish_reason: str = ""


# --------------------------------------------------------------------------- rollouts

ActionKind = Literal["do", "go_backward", "go_forward", "exit"]


class Action(_Msg, frozen=True):
    """A parsed action of the DSL: `do(action=..., argument=..., element=...)`, `exit(...)`."""

    kind: ActionKind
    # For kind == "do": "Click", "Type", "Goto", ... (the DSL's action names).
    name: str = ""
    argument: str | None = None
    element: int | None = None
    # For kind == "exit": the agent's answer.
    message: str | None = None


class EvalCheck(_Msg, frozen=True):
    """One evaluator's verdict: `passed` is None when it could not judge (no fuzzy judge)."""

    kind: str
    passed: bool | None
    detail: str = ""


class Evaluation(_Msg, frozen=True):
    """A task's evaluators run on the final page and the exit message: the binary reward."""

    reward: float
    checks: list[EvalCheck] = []
    # True when some check could not be judged; the reward then is not a real 0/1 score.
    unjudged: bool = False


class TurnTimings(_Msg, frozen=True):
    """Seconds spent in each phase of a turn."""

    observe_s: float = 0.0
    policy_s: float = 0.0
    act_s: float = 0.0


class Turn(_Msg, frozen=True):
    """One observation -> completion -> action step, recorded exactly."""

    index: int
    url: str
    # The full observation this turn showed the model (earlier ones were compressed).
    observation: str
    observation_digest: str
    text: str
    thought: str = ""
    action: Action | None = None
    parse_error: str | None = None
    action_error: str | None = None
    prompt_token_ids: list[int] = []
    completion_token_ids: list[int] = []
    completion_logprobs: list[float] = []
    adapter: str = ""
    adapter_version: int = -1
    timings: TurnTimings = TurnTimings()


TrajectoryStatus = str  # "exited" | "max_turns" | "interrupted" | "error:<kind>"

# Statuses whose episode ended by the policy's own doing: they are evaluated and their
# reward is a fact about the policy. Any other ("interrupted", "error:*") is a failure
# of the infrastructure; its reward says nothing, and the learner does not train on it.
EVALUATED_STATUSES = frozenset({"exited", "max_turns", "parse_failures", "repeated_actions"})


class _Scored(Protocol):
    @property
    def reward(self) -> float: ...
    @property
    def status(self) -> str: ...


def rewards_differ(episodes: Iterable[_Scored]) -> bool:
    """True when the evaluated episodes' rewards are not all equal: their group's GRPO
    advantages are not all zero, so it can teach (the scheduler counts these groups as
    mixed; the learner sets the others aside)."""
    return len({e.reward for e in episodes if e.status in EVALUATED_STATUSES}) > 1


class Trajectory(_Msg, frozen=True):
    """One episode of a task, from the first observation to the reward."""

    episode_id: str
    group_id: str
    task_id: int
    intent: str
    turns: list[Turn] = []
    answer: str | None = None
    reward: float = 0.0
    status: TrajectoryStatus = "exited"
    # Evaluator details (which check passed or failed, unjudged fuzzy matches, ...).
    evaluation: Evaluation | None = None
    adapter_versions: list[int] = []
    started_at: float = 0.0
    finished_at: float = 0.0

    @property
    def scored(self) -> bool:
        """Whether its reward is a fact about the policy: the policy ended it (an evaluated
        status) and no check was left unjudged (a fuzzy match without a judge, an outcome
        reward model that answered neither Yes nor No). Learners train on these only."""
        unjudged = self.evaluation is not None and self.evaluation.unjudged
        return self.status in EVALUATED_STATUSES and not unjudged


class TrajectoryGroup(_Msg, frozen=True):
    """G trajectories of one task; advantages are the learner's job."""

    group_id: str
    task_id: int
    trajectories: list[Trajectory]
    created_at: float
    split: str = ""
    # Steps of the task's scripted solution the oracle played first (`TaskConfig.guide`).
    guide: int = 0

    def rewards_differ(self) -> bool:
        """`rewards_differ` of its trajectories: the group can teach."""
        return rewards_differ(self.trajectories)


class ElementQuery(_Msg, frozen=True):
    """How a scripted plan names an element: by tag, visible text and attributes.

    The oracle resolves it against the rendered observation to get the element id the
    model would have to copy; `nth` picks among several matches (0 = first).
    """

    tag: str | None = None
    text: str | None = None
    text_contains: str | None = None
    attrs: dict[str, str] = {}
    nth: int = 0


class OracleStep(_Msg, frozen=True):
    """One step of a built-in task's scripted solution, independent of element ids.

    `action` is a DSL action name ("Click", "Type", "Search", "Select Dropdown Option",
    "Goto", "Scroll Down", "Press Enter", "Hover", ...) or "go_backward", "go_forward",
    "exit". `message` is the exit answer.
    """

    action: str
    target: ElementQuery | None = None
    argument: str | None = None
    message: str | None = None
    thought: str = ""


class AdapterManifest(_Msg, frozen=True):
    """`manifest.json` beside a saved LoRA adapter; checked before it is ever served.

    Written last, after the weights are fsynced; an adapter folder without a manifest, or
    whose weights do not hash to `weights_sha256`, is half-written and never published.
    """

    name: str
    version: int
    base_model: str
    base_fingerprint: str
    weights_sha256: str
    step: int = 0
    created_at: float = 0.0
    lora_rank: int = 0
    lora_alpha: int = 0
    target_modules: list[str] = []


# --------------------------------------------------------------------------- agent runs


class RunRequest(_Msg, frozen=True, forbid_unknown_fields=True):
    """`POST /v1/runs`: run the agent on an intent from a start URL."""

    intent: Annotated[str, msgspec.Meta(min_length=1, max_length=4000)]
    start_url: Annotated[str, msgspec.Meta(pattern=r"^https?://")]
    # Hosts (or URLs whose host is taken) the agent may visit besides the start URL's.
    sites: list[str] = []
    max_turns: Annotated[int, msgspec.Meta(ge=1)] = 15
    # "policy@v3"; None: the version currently served.
    adapter: str | None = None
    # When given, the run is evaluated like a task and its reward reported.
    evaluation: EvalSpec | None = None


class RunTurn(_Msg, frozen=True):
    """One turn of an agent run as the endpoint reports it."""

    index: int
    url: str
    thought: str
    action: str
    error: str | None = None


class RunState(_Msg, frozen=True):
    """`GET /v1/runs/{id}`."""

    run_id: str
    status: Literal["queued", "running", "finished", "failed", "cancelled"]
    intent: str
    turns: list[RunTurn] = []
    answer: str | None = None
    reward: float | None = None
    episode_status: str | None = None
    error: str | None = None
    adapter: str | None = None
    created_at: float = 0.0
    finished_at: float | None = None


# --------------------------------------------------------------------------- events


class _Event(_Msg, frozen=True, tag_field="event", tag=lambda name: name):
    """Base of the tagged event union; `event` names the type on the wire."""

    at: float


class EpisodeStarted(_Event, frozen=True):
    episode_id: str
    group_id: str
    task_id: int


class TurnTaken(_Event, frozen=True):
    episode_id: str
    index: int
    action: str
    adapter: str = ""
    error: str | None = None


class EpisodeFinished(_Event, frozen=True):
    episode_id: str
    group_id: str
    task_id: int
    status: str
    reward: float
    turns: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    split: str = ""


class GroupReady(_Event, frozen=True):
    group_id: str
    task_id: int
    rewards: list[float]


class UpdateApplied(_Event, frozen=True):
    version: int
    step: int
    groups_trained: int
    groups_stale: int = 0
    groups_zero_variance: int = 0
    # Groups left with fewer than two evaluated trajectories once those that ended by an
    # infrastructure failure (interrupted, error:*) were dropped; and how many were dropped.
    groups_failed: int = 0
    trajectories_dropped: int = 0
    metrics: dict[str, float] = {}


class AdapterPublished(_Event, frozen=True):
    version: int
    name: str
    path: str


class AdapterSwapped(_Event, frozen=True):
    name: str
    previous: str
    latency_s: float


class EvalFinished(_Event, frozen=True):
    """Success of one adapter version on an evaluation split."""

    split: str
    version: int
    episodes: int
    success: float
    by_site: dict[str, float] = {}


class Fault(_Event, frozen=True):
    kind: str
    message: str
    where: str = ""


Event = (
    EpisodeStarted
    | TurnTaken
    | EpisodeFinished
    | GroupReady
    | UpdateApplied
    | AdapterPublished
    | AdapterSwapped
    | EvalFinished
    | Fault
)

# --------------------------------------------------------------------------- codecs

Format = Literal["json", "msgpack"]

_ENCODERS: dict[str, msgspec.json.Encoder | msgspec.msgpack.Encoder] = {
    "json": msgspec.json.Encoder(),
    "msgpack": msgspec.msgpack.Encoder(),
}
_DECODERS: dict[tuple[Any, str], msgspec.json.Decoder[Any] | msgspec.msgpack.Decoder[Any]] = {}


def encode(message: Any, *, format: Format = "json") -> bytes:
    """A message (or a list or dict of them) as JSON or msgpack bytes.

    A string UTF-8 cannot hold (a lone UTF-16 surrogate, which a page's script can put in
    its text and an error message can carry on) is written with U+FFFD in its place: the
    record is kept, not refused.
    """
    encoder = _ENCODERS[format]
    try:
        return encoder.encode(message)
    except UnicodeEncodeError:
        return encoder.encode(well_formed_tree(msgspec.to_builtins(message)))


def decode(data: bytes, type_: Any, *, format: Format = "json") -> Any:
    """A message of `type_` (a Struct, a union like `Event`, or a container of them).

    Decoders are built once per (type, format) and reused.
    """
    key = (type_, format)
    decoder = _DECODERS.get(key)
    if decoder is None:
        decoder = (
            msgspec.json.Decoder(type_) if format == "json" else msgspec.msgpack.Decoder(type_)
        )
        _DECODERS[key] = decoder
    return decoder.decode(data)


def decode_event(data: bytes, *, format: Format = "json") -> Event:
    """An event; its `event` field selects the type."""
    event: Event = decode(data, Event, format=format)
    return event


def decode_group(data: bytes, *, format: Format = "json") -> TrajectoryGroup:
    """A trajectory group."""
    group: TrajectoryGroup = decode(data, TrajectoryGroup, format=format)
    return group
