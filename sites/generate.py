"""WebRL's in-breadth evolution for self-hosted WebArena: a chat model writes new intents.

The built-in suite makes new tasks from its own templates (`sites.builtin.evolve`); on
WebArena there are no templates, so, as WebRL does, a language model (any OpenAI-compatible
chat model named in `[webrl] generator_url` / `generator_model`) reads a task the policy
failed and writes new ones on the same site and start page, some easier, some harder:

1. **write**: one request per failed parent; the reply is read line by line, each line a
   JSON object `{"intent": "...", "kind": "easier" | "harder"}`. A line that does not parse,
   has no intent, is longer than `MAX_INTENT_CHARS`, repeats the parent or another intent
   of the phase, or names a URL, is dropped and counted with its reason; never run.
2. **feasibility**: each remaining intent goes back to the model with the start page the
   parent's episodes saw (when one was seen): "can this be done on this site as it is?".
   The last Yes/No word of the reply decides; a reply with neither, or a failed request, is
   dropped and counted as well.

A kept intent becomes a task of the parent's site, start URL, login and storage state,
with `eval_types ["orm"]`: it has no evaluator, the outcome reward model scores it
(`runtime.labeling`). Its `extra_fields` carry `evolved_from`, `phase` and `kind`, as the
built-in evolution's do; ids count up from `GENERATED_ID_BASE`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from runtime.base.messages import EvalSpec, TaskConfig
from sites.builtin.evolve import KIND_FIELD, PARENT_FIELD, PHASE_FIELD
from sites.chat import ChatModel
from sites.errors import GeneratorError

__all__ = [
    "GENERATED_ID_BASE",
    "MAX_INTENT_CHARS",
    "Generation",
    "IntentGenerator",
    "parse_intents",
]

GENERATED_ID_BASE = 400_000
MAX_INTENT_CHARS = 300
_KINDS = ("easier", "harder")
_URL = re.compile(r"https?://|www\.", re.IGNORECASE)
_VERDICT = re.compile(r"\b(yes|no)\b", re.IGNORECASE)

_SYSTEM = (
    "You write tasks for a web agent that practises on a website. Each task is one "
    "instruction a person could give, answerable or doable on that website alone."
)
_WRITE = (
    "The agent failed this task on the {site} website, starting at {start}:\n\n"
    "{intent}\n\nWrite {n} new tasks on the same website and start page that practise "
    "related skills: some easier, some harder. Write one task per line, each line a JSON "
    'object: {{"intent": "<the task>", "kind": "easier"}} or {{"intent": "<the task>", '
    '"kind": "harder"}}. Write nothing else.'
)
_FEASIBLE = (
    "Website: {site}. Start page:\n\n{page}\n\nTask: {intent}\n\nCan this task be done on "
    "this website as it is (the things it names exist, the actions it needs are there)? "
    "Answer Yes or No."
)
_PAGE_CHARS = 3000


@dataclass
class Generation:
    """One phase's generated tasks, and what was dropped on the way (reason: count)."""

    tasks: list[TaskConfig] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


def parse_intents(reply: str, out: Generation) -> list[tuple[str, str]]:
    """(intent, kind) of every usable line of a reply; the others are counted in `out`."""
    found: list[tuple[str, str]] = []
    for raw in reply.splitlines():
        line = raw.strip().strip(",")
        if not line:
            continue
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: brackets nested too deeply
            out.drop("not JSON")
            continue
        intent = item.get("intent") if isinstance(item, dict) else None
        if not isinstance(intent, str) or not intent.strip():
            out.drop("no intent")
            continue
        kind = item.get("kind")
        found.append((" ".join(intent.split()), kind if kind in _KINDS else "related"))
    return found


class IntentGenerator:
    """Writes, filters and builds new WebArena tasks from failed ones."""

    def __init__(self, model: ChatModel, *, next_id: int = GENERATED_ID_BASE) -> None:
        self.model = model
        self.next_id = next_id

    def used(self, task: TaskConfig) -> None:
        """A task made before a restart: ids continue after it."""
        self.next_id = max(self.next_id, task.task_id + 1)

    async def generate(
        self,
        failed: Sequence[TaskConfig],
        *,
        phase: int,
        per_parent: int,
        start_pages: Mapping[str, str],
    ) -> Generation:
        """Up to `per_parent` feasible new tasks for each failed parent."""
        out = Generation()
        seen = {" ".join(t.intent.split()).lower() for t in failed}
        for parent in failed:
            site = ", ".join(parent.sites) or "the"
            try:
                reply = await self.model.ask(
                    _SYSTEM,
                    _WRITE.format(site=site, start=parent.start_url, intent=parent.intent,
                                  n=per_parent),
                    temperature=1.0,
                )  # fmt: skip
            except GeneratorError:
                out.drop("request failed")
                continue
            made = 0
            for intent, kind in parse_intents(reply, out):
                if made >= per_parent:
                    out.drop("over the number asked for")
                    continue
                reason = self._refused(intent, seen)
                if reason is None:
                    reason = await self._infeasible(site, start_pages.get(parent.start_url), intent)
                if reason is not None:
                    out.drop(reason)
                    continue
                seen.add(intent.lower())
                out.tasks.append(self._task(parent, intent, kind, phase))
                made += 1
        return out

    @staticmethod
    def _refused(intent: str, seen: set[str]) -> str | None:
        if len(intent) > MAX_INTENT_CHARS:
            return "too long"
        if intent.lower() in seen:
            return "a repeat"
        if _URL.search(intent):
            return "names a URL"
        return None

    async def _infeasible(self, site: str, page: str | None, intent: str) -> str | None:
        shown = (page or "(not seen yet)")[:_PAGE_CHARS]
        try:
            reply = await self.model.ask(
                _SYSTEM, _FEASIBLE.format(site=site, page=shown, intent=intent)
            )
        except GeneratorError:
            return "feasibility request failed"
        verdicts = _VERDICT.findall(reply)
        if not verdicts:
            return "no feasibility verdict"
        return None if verdicts[-1].lower() == "yes" else "infeasible"

    def _task(self, parent: TaskConfig, intent: str, kind: str, phase: int) -> TaskConfig:
        task = msgspec.structs.replace(
            parent,
            task_id=self.next_id,
            intent=intent,
            eval=EvalSpec(eval_types=["orm"]),
            intent_template=msgspec.UNSET,
            instantiation_dict=msgspec.UNSET,
            intent_template_id=msgspec.UNSET,
            require_reset=msgspec.UNSET,
            extra_fields={PARENT_FIELD: parent.task_id, PHASE_FIELD: phase, KIND_FIELD: kind},
        )
        self.next_id += 1
        return task
