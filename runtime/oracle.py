"""The oracle: a scripted `Policy` that solves built-in tasks through the model's own view.

For each episode it follows `plan_for(task)` (the built-in sites' scripted solution, a
list of `OracleStep`s). Each step names its target element by tag, visible text and
attributes (`ElementQuery`), never by id: the oracle reads the ids from the observation
in the last user message, exactly the text the model gets (`parse_elements`), and
replies like a model would: `<think>{thought}</think><answer>{action}</answer>`. A thought
that acts on an element ends by naming it as the page shows it, id included ("Open the
merge request (link Refactor: install guide [13])."): the demonstrations teach the choice
in words, the id is copied from the page line the thought repeats, and the action copies
the id from the thought.

When a step's target is not in the observation but the page was cut by the token
budget (or scrolled), the oracle scrolls towards it first. When it cannot find the target
at all it exits with a message saying so (the episode then fails: a plan, observation or
evaluator bug to look into, never a silent success).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from runtime.actions import format_action
from runtime.base.messages import (
    Action,
    ElementQuery,
    OracleStep,
    PolicyReply,
    PolicyRequest,
    TaskConfig,
)
from runtime.observation import Element
from runtime.reading import compact_shown_as, parse_elements

__all__ = ["OraclePolicy", "resolve"]

PlanFor = Callable[[TaskConfig], list[OracleStep]]

_MAX_EPISODES = 4096
_MAX_SCROLLS = 20


@dataclass(slots=True)
class _State:
    plan: list[OracleStep]
    step: int = 0
    scrolls: int = 0


def _plan_for_builtin(task: TaskConfig) -> list[OracleStep]:
    from sites.builtin import plan_for

    return plan_for(task)


_HTML_ELEMENT = re.compile(r'<[a-z][a-z0-9]*\b[^>]*\bid="\d+"')


class OraclePolicy:
    """Follows scripted plans; `style` is the observation style it reads ("html"/"compact",
    or "auto": told apart by the page, since only "html" writes tags with ids)."""

    def __init__(self, plan_for: PlanFor | None = None, *, style: str = "auto") -> None:
        self.plan_for: PlanFor = plan_for or _plan_for_builtin
        self.style = style
        self._episodes: OrderedDict[str, _State] = OrderedDict()

    async def act(self, request: PolicyRequest) -> PolicyReply:
        state = self._episodes.get(request.episode_id)
        if state is None or request.turn == 0:
            state = _State(plan=list(self.plan_for(request.task)))
            self._episodes[request.episode_id] = state
            while len(self._episodes) > _MAX_EPISODES:
                self._episodes.popitem(last=False)
        self._episodes.move_to_end(request.episode_id)
        observation = request.messages[-1].content
        thought, action = self._next(state, observation)
        if action.kind == "exit":
            self._episodes.pop(request.episode_id, None)
        text = f"<think>{thought}</think><answer>{format_action(action)}</answer>"
        return PolicyReply(text=text, finish_reason="stop")

    def steps_done(self, episode_id: str) -> int:
        """Steps of the plan played so far in an episode (0 before its first turn)."""
        state = self._episodes.get(episode_id)
        return 0 if state is None else state.step

    def forget(self, episode_id: str) -> None:
        """Drop an episode's place in its plan (another policy goes on with it)."""
        self._episodes.pop(episode_id, None)

    def _next(self, state: _State, observation: str) -> tuple[str, Action]:
        if state.step >= len(state.plan):
            return "The plan is finished.", Action(kind="exit", message="")
        step = state.plan[state.step]
        element: int | None = None
        if step.target is not None:
            style = self.style
            if style == "auto":
                style = "html" if _HTML_ELEMENT.search(observation) else "compact"
            elements = parse_elements(observation, style)
            found = resolve(step.target, elements)
            if found is None:
                scroll = _scroll_direction(observation)
                if scroll is not None and state.scrolls < _MAX_SCROLLS:
                    state.scrolls += 1
                    return (
                        f"I do not see {_describe(step.target)} yet; scrolling to find it.",
                        Action(kind="do", name=scroll),
                    )
                state.step = len(state.plan)
                return (
                    f"I cannot find {_describe(step.target)} on this page.",
                    Action(
                        kind="exit", message=f"oracle: no element matches {_describe(step.target)}"
                    ),
                )
            element = found.id
        state.step += 1
        state.scrolls = 0
        thought = step.thought or _default_thought(step)
        if element is not None:
            thought = _naming(thought, _shown_as(observation, element, found))
        return thought, _action(step, element)


def _naming(thought: str, name: str) -> str:
    """`thought` with the element it acts on named last: "Open it." -> "Open it (link X [3])."."""
    stem = thought.rstrip()
    end = stem[-1] if stem and stem[-1] in ".!?" else "."
    return f"{stem.rstrip('.!?')} ({name}){end}"


def _shown_as(observation: str, element: int, found: Element | None) -> str:
    """The element as the observation shows it, with its id: the compact line ("link
    Refactor: install guide [13]"), or the tag and text of an html element ("a Refactor
    [13]"). Writing the page's own line lets a model copy the id the way it copies any
    repeated text (the tokens after a repeated prefix), and the action copies it from
    the thought."""
    shown = compact_shown_as(observation, element)
    if shown is None:
        shown = "element" if found is None else f"{found.tag} {found.text}".strip()
    return f"{shown} [{element}]"


def _action(step: OracleStep, element: int | None) -> Action:
    match step.action:
        case "exit":
            return Action(kind="exit", message=step.message or "")
        case "go_backward" | "go_forward":
            return Action(kind=step.action)
        case _:
            return Action(kind="do", name=step.action, argument=step.argument, element=element)


def _default_thought(step: OracleStep) -> str:
    if step.action == "exit":
        return "The task is done."
    if step.target is not None:
        return f"I will {step.action.lower()} {_describe(step.target)}."
    return f"I will {step.action.lower()}."


def _describe(query: ElementQuery) -> str:
    parts = [query.tag or "element"]
    if query.text is not None:
        parts.append(repr(query.text))
    if query.text_contains is not None:
        parts.append(f"containing {query.text_contains!r}")
    parts += [f"{k}={v!r}" for k, v in sorted(query.attrs.items())]
    return " ".join(parts)


def _scroll_direction(observation: str) -> str | None:
    if "<!-- truncated:" in observation:
        return "Scroll Down"
    if "lines above: Scroll Up" in observation:
        return "Scroll Up"
    return None


def _norm(text: str) -> str:
    return " ".join(text.split())


def _same(shown: str, wanted: str) -> bool:
    """`shown` (possibly cut to `max_text_chars` with "…") is `wanted`."""
    shown, wanted = _norm(shown), _norm(wanted)
    if shown == wanted:
        return True
    return shown.endswith("…") and wanted.startswith(shown[:-1].rstrip())


def _matches(query: ElementQuery, element: Element) -> bool:
    if query.tag is not None and element.tag != query.tag.lower():
        return False
    if query.text is not None and not _same(element.text, query.text):
        return False
    if query.text_contains is not None and _norm(query.text_contains) not in _norm(element.text):
        return False
    for name, wanted in query.attrs.items():
        shown = element.attrs.get(name)
        if shown is None and "kind" in element.attrs:
            # A compact observation keeps one label for placeholder/aria-label/name/title.
            shown = element.attrs.get("label")
        if shown is None or not _same(shown, wanted):
            return False
    return True


def resolve(query: ElementQuery, elements: Sequence[Element]) -> Element | None:
    """The `query.nth` element (in id order) that `query` matches, or None."""
    matches = [e for e in elements if _matches(query, e)]
    if query.nth < len(matches):
        return matches[query.nth]
    return None
