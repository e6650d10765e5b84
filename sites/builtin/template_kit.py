"""The kit the built-in task templates (`tasks_*.py`) are written with: `Template` and
`Built`, the oracle's plan steps (`link`, `button`, `type_into`, `search`, `select`,
`exit_with`, `next_pages`) and the WebArena evaluator specs (`string_match`, `url_match`,
`program_html`). `sites.builtin.suite` assembles the templates into the suite; this module
imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from msgspec import UNSET

from runtime.base.messages import (
    ElementQuery,
    EvalSpec,
    OracleStep,
    ProgramHtmlCheck,
    ReferenceAnswers,
)
from sites.builtin.data import World
from sites.builtin.tenants import Tenant

__all__ = [
    "PLACEHOLDER",
    "Built",
    "Template",
    "button",
    "exit_with",
    "link",
    "next_pages",
    "program_html",
    "search",
    "select",
    "string_match",
    "type_into",
    "url_match",
]

# A task's site, as its start URL and evaluator URLs name it before the sites' real
# addresses are known.
PLACEHOLDER = {
    "shopping": "__SHOPPING__",
    "shopping_admin": "__SHOPPING_ADMIN__",
    "reddit": "__REDDIT__",
    "gitlab": "__GITLAB__",
    "map": "__MAP__",
}


@dataclass(frozen=True)
class Built:
    """One instantiated task, before it gets an id."""

    intent: str
    start: str  # path on the template's site, e.g. "/product/5"
    eval: EvalSpec
    plan: list[OracleStep]
    require_login: bool = False
    require_reset: bool = False


@dataclass(frozen=True)
class Template:
    """A task template of one site."""

    id: int
    site: str  # task site name: "shopping", "shopping_admin", "reddit", "gitlab", "map"
    name: str
    intent_template: str
    candidates: Callable[[World, Tenant], list[dict[str, str]]]
    build: Callable[[World, Tenant, dict[str, str]], Built]
    ood: bool = False
    train_cap: int = 30


# --------------------------------------------------------------------------- plan steps


def link(text: str, thought: str, *, nth: int = 0) -> OracleStep:
    """Click the link whose visible text is `text`."""
    return OracleStep(
        action="Click", target=ElementQuery(tag="a", text=text, nth=nth), thought=thought
    )


def button(text: str, thought: str) -> OracleStep:
    """Click the button whose visible text is `text`."""
    return OracleStep(action="Click", target=ElementQuery(tag="button", text=text), thought=thought)


def type_into(name: str, value: str, thought: str, *, tag: str = "input") -> OracleStep:
    """Replace the text of the field named `name` with `value`."""
    return OracleStep(
        action="Type",
        target=ElementQuery(tag=tag, attrs={"name": name}),
        argument=value,
        thought=thought,
    )


def search(name: str, value: str, thought: str) -> OracleStep:
    """Type `value` into the field named `name` and press Enter."""
    return OracleStep(
        action="Search",
        target=ElementQuery(tag="input", attrs={"name": name}),
        argument=value,
        thought=thought,
    )


def select(name: str, option: str, thought: str) -> OracleStep:
    """Choose the option with visible text `option` in the select named `name`."""
    return OracleStep(
        action="Select Dropdown Option",
        target=ElementQuery(tag="select", attrs={"name": name}),
        argument=option,
        thought=thought,
    )


def exit_with(message: str, thought: str) -> OracleStep:
    return OracleStep(action="exit", message=message, thought=thought)


def next_pages(index: int, per_page: int, what: str) -> list[OracleStep]:
    """Next-link clicks from page 1 to the page holding item `index` (0-based)."""
    return [
        link("Next", f"{what} is not on this page; go to the next page.")
        for _ in range(index // per_page)
    ]


# --------------------------------------------------------------------------- eval specs


def string_match(
    *, exact: str | None = None, must_include: list[str] | None = None, note: str = ""
) -> EvalSpec:
    included: list[str | int | float] | None = None
    if must_include is not None:
        included = [*must_include]
    answers = ReferenceAnswers(
        exact_match=exact if exact is not None else UNSET,
        must_include=included if included is not None else UNSET,
    )
    raw = exact if exact is not None else " |AND| ".join(must_include or [])
    return EvalSpec(
        eval_types=["string_match"],
        reference_answers=answers,
        reference_url="",
        program_html=[],
        string_note=note,
        reference_answer_raw_annotation=raw,
    )


def url_match(site: str, path: str) -> EvalSpec:
    return EvalSpec(
        eval_types=["url_match"],
        reference_answers=None,
        reference_url=f"{PLACEHOLDER[site]}{path}",
        url_note="GOLD in PRED",
        program_html=[],
    )


def program_html(site: str, checks: list[tuple[str, str, dict[str, Any]]]) -> EvalSpec:
    """`checks`: (path on `site` or "last", JS locator expression, required_contents)."""
    return EvalSpec(
        eval_types=["program_html"],
        reference_answers=None,
        reference_url="",
        program_html=[
            ProgramHtmlCheck(
                url=path if path == "last" else f"{PLACEHOLDER[site]}{path}",
                locator=locator,
                required_contents=required,
            )
            for path, locator, required in checks
        ],
    )
