"""WebArena's evaluators: the reward of an episode from its final page and exit message.

`evaluate` runs the checks of every type in `eval.eval_types` and multiplies them:

- string_match: the answer against each rule of `eval.reference_answers` (exact_match,
  must_include, must_exclude, one_of, required_values, fuzzy_match); rules in
  `sites.matching`.
- url_match: the page's URL against `eval.reference_url` under `eval.url_note` ("GOLD in
  PRED" when absent, WebArena's default; WebArena-Lite's evaluator defaults to "EXACT",
  but its file names "GOLD in PRED" on all url_match tasks but one).
- program_html: for each entry, go to its URL ("last": stay on the page the agent ended
  on), run its `prep_actions`, read its `locator` (a JS expression run in the page under a
  timeout; empty: the page's HTML), and check `required_contents` with the same rules.
- orm: nothing here; the check stays `passed=None` (`ORM_PENDING`) for WebRL's outcome
  reward model, which reads the whole episode once it has ended (`runtime.labeling`).

Fuzzy matches go to a `Judge`. A list of fuzzy references is joined with ", " and judged
once (as WebArena-Lite does). Without a judge, or when it fails, such a check is
`passed=None` and the evaluation `unjudged=True` with reward 0: never a guessed score.
"N/A" follows WebArena: for an unachievable task (reference "N/A") the bare answer "N/A"
passes, any other answer needs the judge to compare its reason with `string_note`; for
an achievable task the answer "N/A" fails without asking anyone. The judge is not asked
when another check has already failed (the reward is 0 whatever it says).

The page the agent ended on is captured first: url_match and `__last_url__` use it,
and "last" entries run before any entry that navigates away.

WebArena's `func:` helpers: `reddit_get_post_url` and `gitlab_get_project_memeber_role`
are implemented; the shopping ones need Magento's REST API with admin credentials and
give `passed=None` with an "unsupported" detail (`unsupported(task)` lists them ahead).

Playwright errors are converted here, in `_page_call`: a locator that throws or times out
is a failed check with its detail; a page that cannot be navigated or is gone raises
`PageError` / `PageClosedError` (the environment failed, not the agent).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import anyio
import structlog
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page

from runtime.base.messages import (
    EvalCheck,
    Evaluation,
    ProgramHtmlCheck,
    ReferenceAnswers,
    TaskConfig,
)
from sites.errors import JudgeError, PageClosedError, PageError
from sites.judge import Judge
from sites.matching import (
    GOLD_IN_PRED,
    exact_match,
    includes,
    normalize,
    numbers,
    required_value_holds,
    url_matches,
)
from sites.tasks import (
    LAST_URL,
    PAGE_ARG,
    FuncCall,
    answer_rules,
    check_task,
    content_rules,
    parse_func,
    rule_values,
    substitute,
)

__all__ = ["ORM_PENDING", "evaluate", "evaluation_of", "unsupported"]

# The detail of an "orm" check before the outcome reward model has judged the episode.
ORM_PENDING = "left to the outcome reward model"

_log = structlog.get_logger(__name__)
_T = TypeVar("_T")

_URL_HELPERS = {"reddit_get_post_url": 1}
_LOCATOR_HELPERS = {"gitlab_get_project_memeber_role": 2}
_SNIPPET = 160
_API_PREFIX = re.compile(r"^[A-Z]\w*\.\w+: ")

# GitLab's project members page: the role cell of the row whose account reads "@name".
_GITLAB_ROLE_JS = """(account) => {
  for (const cell of document.querySelectorAll("td[data-label='Account']")) {
    const label = cell.querySelector("span.gl-avatar-labeled-sublabel");
    if (!label || label.innerText.trim() !== "@" + account) continue;
    const row = cell.closest("tr");
    const role = row && row.querySelector("td.col-max-role");
    if (!role) return "";
    const span = role.querySelector("span");
    return (span || role).innerText.trim();
  }
  return "";
}"""


@dataclass
class _Check:
    kind: str
    passed: bool | None
    detail: str = ""


@dataclass
class _Fuzzy:
    """A check waiting for the judge."""

    check: _Check
    intent: str
    reference: str
    answer: str
    unachievable: bool


# --------------------------------------------------------------------------- helpers


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _SNIPPET else flat[: _SNIPPET - 3] + "..."


def _reddit_post_url(url: str) -> str:
    """`.../f/forum/123/slug/comment/9` -> `.../f/forum/123/`; other URLs unchanged."""
    parts = urlsplit(url)
    segments = parts.path.split("/")
    if len(segments) < 4 or segments[1] != "f":
        return url
    return urlunsplit((parts.scheme, parts.netloc, f"/f/{segments[2]}/{segments[3]}/", "", ""))


def _helper_problem(call: FuncCall, helpers: Mapping[str, int]) -> str | None:
    if call.name not in helpers:
        return f"unsupported: helper {call.name}() is not implemented here"
    if len(call.args) != helpers[call.name]:
        return f"unsupported: {call.name}() with {len(call.args)} arguments"
    if helpers is _LOCATOR_HELPERS and call.args[0] != PAGE_ARG:
        return f"unsupported: {call.name}() must get {PAGE_ARG} first"
    return None


def _entry_problem(entry: ProgramHtmlCheck) -> str | None:
    for text, helpers in ((entry.url, _URL_HELPERS), (entry.locator, _LOCATOR_HELPERS)):
        if text.startswith("func:"):
            problem = _helper_problem(parse_func(text), helpers)
            if problem:
                return f"{problem} ({text})"
    return None


def unsupported(task: TaskConfig) -> list[str]:
    """Why some checks of `task` cannot be run here ("program_html[0]: ..."); [] if none."""
    if "program_html" not in task.eval.eval_types:
        return []
    out: list[str] = []
    for i, entry in enumerate(task.eval.program_html or []):
        problem = _entry_problem(entry)
        if problem:
            out.append(f"program_html[{i}]: {problem}")
    return out


def _as_text(value: Any) -> str:
    """A locator's JS result as text: null is empty, lists one item per line."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list | tuple):
        return "\n".join(_as_text(item) for item in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _is_closed(exc: PlaywrightError) -> bool:
    message = exc.message
    return (
        type(exc).__name__ == "TargetClosedError"
        or "has been closed" in message
        or "Target crashed" in message
    )


async def _page_call(what: str, call: Callable[[], Awaitable[_T]]) -> _T:
    """The one place Playwright errors become `sites.errors` types."""
    try:
        return await call()
    except PlaywrightError as exc:
        lines = exc.message.strip().splitlines()
        # "Page.evaluate: TypeError: ..." -> "TypeError: ..."
        first = _API_PREFIX.sub("", lines[0]) if lines else type(exc).__name__
        error = PageClosedError if _is_closed(exc) else PageError
        raise error(f"{what}: {first}") from exc


# --------------------------------------------------------------------------- rules


def _rule_checks(
    prefix: str,
    rules: Mapping[str, Any],
    text: str,
    *,
    intent: str,
    what: str,
    fuzzy: list[_Fuzzy],
) -> list[_Check]:
    """Checks of `text` (an answer or a page's content) against string rules."""
    checks: list[_Check] = []
    seen = _snippet(text)
    for name, value in rules.items():
        kind = f"{prefix}.{name}"
        values = rule_values(value)
        if name == "exact_match":
            ok = exact_match(values[0], text)
            checks.append(_Check(kind, ok, f"expected {values[0]!r}, {what} {seen!r}"))
        elif name == "must_include":
            for ref in values:
                ok = includes(ref, text)
                verb = "found in" if ok else "not found in"
                checks.append(_Check(kind, ok, f"{ref!r} {verb} {what} {seen!r}"))
        elif name == "must_exclude":
            for ref in values:
                ok = not includes(ref, text)
                verb = "absent from" if ok else "found in"
                checks.append(_Check(kind, ok, f"{ref!r} {verb} {what} {seen!r}"))
        elif name == "one_of":
            hits = [ref for ref in values if includes(ref, text)]
            detail = f"{hits[0]!r} found" if hits else f"none of {values!r} found"
            checks.append(_Check(kind, bool(hits), f"{detail} in {what} {seen!r}"))
        elif name == "required_values":
            found = numbers(text)
            if len(found) != 1:
                detail = f"needs exactly one number, {what} {seen!r} has {len(found)}"
                checks.append(_Check(kind, False, detail))
                continue
            for spec in values:
                ok = required_value_holds(spec, found[0])
                checks.append(_Check(kind, ok, f"{found[0]} {'meets' if ok else 'fails'} {spec!r}"))
        elif name == "fuzzy_match":
            reference = ", ".join(values)
            check = _Check(kind, None, f"reference {reference!r}, {what} {seen!r}")
            checks.append(check)
            if not text.strip():
                check.passed, check.detail = False, f"{what} is empty"
            else:
                fuzzy.append(_Fuzzy(check, intent, reference, text, unachievable=False))
    return checks


def _string_checks(task: TaskConfig, answer: str | None, fuzzy: list[_Fuzzy]) -> list[_Check]:
    answers = task.eval.reference_answers
    assert isinstance(answers, ReferenceAnswers)  # check_task made sure
    rules = answer_rules(answers)
    if answer is None:
        return [
            _Check("string_match", False, "no answer: the episode ended without exit(message=...)")
        ]
    checks: list[_Check] = []
    fuzzy_ref = rules.pop("fuzzy_match", None)
    checks += _rule_checks(
        "string_match", rules, answer, intent=task.intent, what="answer", fuzzy=fuzzy
    )
    if fuzzy_ref is None:
        return checks
    reference = ", ".join(rule_values(fuzzy_ref))
    kind = "string_match.fuzzy_match"
    said_na = normalize(answer).removesuffix(".") == "n/a"
    if normalize(reference) == "n/a":
        if said_na:
            checks.append(_Check(kind, True, "unachievable task answered 'N/A'"))
        else:
            note = task.eval.string_note
            reason = note if isinstance(note, str) and note.strip() else "the task cannot be done"
            check = _Check(
                kind, None, f"unachievable task; reason {reason!r}, answer {_snippet(answer)!r}"
            )
            checks.append(check)
            fuzzy.append(_Fuzzy(check, task.intent, reason, answer, unachievable=True))
    elif said_na:
        checks.append(
            _Check(kind, False, f"answered 'N/A' but the task has an answer ({reference!r})")
        )
    else:
        checks += _rule_checks(
            "string_match",
            {"fuzzy_match": fuzzy_ref},
            answer,
            intent=task.intent,
            what="answer",
            fuzzy=fuzzy,
        )
    return checks


def _url_check(task: TaskConfig, final_url: str, urls: Mapping[str, str]) -> _Check:
    reference = substitute(str(task.eval.reference_url), urls)
    note = task.eval.url_note
    rule = note if isinstance(note, str) and note else GOLD_IN_PRED
    ok = url_matches(reference, final_url, rule=rule)
    return _Check(
        "url_match",
        ok,
        f"page {final_url!r} {'matches' if ok else 'does not match'} {reference!r} ({rule})",
    )


# --------------------------------------------------------------------------- program_html


@dataclass(frozen=True)
class _Limits:
    locator_s: float
    navigation_s: float
    settle_s: float


async def _navigate(page: Page, url: str, limits: _Limits) -> None:
    ms = limits.navigation_s * 1000
    await _page_call(f"going to {url}", lambda: page.goto(url, wait_until="load", timeout=ms))
    # Script-rendered parts (GitLab's member lists) need the network to settle; WebArena
    # sleeps 3 s here. Wait for that condition instead (at least 0.5 s, at most settle_s).
    if limits.settle_s <= 0:
        return
    try:
        settle = limits.settle_s * 1000
        await _page_call(
            "settling", lambda: page.wait_for_load_state("networkidle", timeout=settle)
        )
    except PageClosedError:
        raise
    except PageError:
        pass


async def _run_js(page: Page, script: str, arg: Any, limits: _Limits, what: str) -> tuple[Any, str]:
    """(result, "") or (None, why it failed) for a script run under the locator timeout."""
    try:
        with anyio.move_on_after(limits.locator_s) as scope:
            return await _page_call(what, lambda: page.evaluate(script, arg)), ""
    except PageClosedError:
        raise
    except PageError as exc:
        return None, f"{what} threw {str(exc).removeprefix(f'{what}: ')}"
    assert scope.cancelled_caught
    return None, f"{what} timed out after {limits.locator_s:g} s"


async def _locate(page: Page, entry: ProgramHtmlCheck, limits: _Limits) -> tuple[str | None, str]:
    """The entry's located text, or (None, why not)."""
    for action in entry.prep_actions or []:
        # As in WebArena, a failing preparation step is not fatal: the locator decides.
        await _run_js(page, f"() => {{ {action} }}", None, limits, "prep action")
    locator = entry.locator.strip()
    if not locator:
        with anyio.move_on_after(limits.locator_s):
            return html.unescape(await _page_call("reading the page", page.content)), ""
        return None, f"reading the page timed out after {limits.locator_s:g} s"
    if locator.startswith("func:"):
        call = parse_func(locator)  # only gitlab_get_project_memeber_role gets here
        value, problem = await _run_js(page, _GITLAB_ROLE_JS, call.args[1], limits, call.name)
    else:
        body = locator.rstrip(";").rstrip()
        value, problem = await _run_js(page, f"() => (\n{body}\n)", None, limits, "locator")
    if problem:
        return None, problem
    return html.unescape(_as_text(value)), ""


async def _program_html_checks(
    task: TaskConfig,
    page: Page,
    *,
    final_url: str,
    urls: Mapping[str, str],
    limits: _Limits,
    fuzzy: list[_Fuzzy],
) -> list[_Check]:
    entries = list(enumerate(task.eval.program_html or []))
    # Entries that read the agent's last page run before any that navigate away.
    entries.sort(key=lambda item: item[1].url != "last")
    by_index: dict[int, list[_Check]] = {}
    for i, entry in entries:
        prefix = f"program_html[{i}]"
        problem = _entry_problem(entry)
        if problem:
            by_index[i] = [_Check(prefix, None, problem)]
            continue
        if entry.url.startswith("func:"):
            call = parse_func(entry.url)
            target: str | None = _reddit_post_url(
                final_url if call.args[0] == LAST_URL else call.args[0]
            )
        else:
            target = None if entry.url == "last" else substitute(entry.url, urls)
        if target is not None:
            await _navigate(page, target, limits)
        text, why = await _locate(page, entry, limits)
        where = f"on {page.url}"
        if text is None:
            by_index[i] = [_Check(prefix, False, f"{why} {where}")]
            continue
        rules = content_rules(entry.required_contents)
        by_index[i] = _rule_checks(
            prefix, rules, text, intent=task.intent, what=f"content {where}", fuzzy=fuzzy
        )
    return [check for i in sorted(by_index) for check in by_index[i]]


# --------------------------------------------------------------------------- evaluate


async def _judge(pending: list[_Fuzzy], judge: Judge | None, decided_fail: bool) -> None:
    for item in pending:
        check = item.check
        if decided_fail:
            check.detail = f"not judged: another check failed; {check.detail}"
        elif judge is None:
            check.detail = f"unjudged: no fuzzy-match judge configured; {check.detail}"
        else:
            try:
                if item.unachievable:
                    ok = await judge.unachievable_match(
                        intent=item.intent, reason=item.reference, answer=item.answer
                    )
                else:
                    ok = await judge.fuzzy_match(
                        intent=item.intent, reference=item.reference, answer=item.answer
                    )
            except JudgeError as exc:
                _log.warning("judge.failed", error=str(exc))
                check.detail = f"unjudged: {exc}; {check.detail}"
                continue
            check.passed = ok
            decided_fail = decided_fail or not ok


async def evaluate(
    task: TaskConfig,
    *,
    answer: str | None,
    page: Page,
    urls: Mapping[str, str],
    judge: Judge | None = None,
    locator_timeout_s: float = 5.0,
    navigation_timeout_s: float = 15.0,
    settle_timeout_s: float = 3.0,
) -> Evaluation:
    """Score an episode: the product of the task's checks on `answer` and `page`.

    `answer` is the agent's exit message (None if it never exited); `page` is the page it
    ended on (program_html may navigate it); `urls` resolves `__SITE__` placeholders left
    in the task. After navigating, program_html waits up to `settle_timeout_s` for the
    network to go idle (0: not at all; server-rendered sites need no wait). Raises
    PageError when the browser fails under the evaluator,
    PlaceholderError when `urls` lacks a site the task names, TaskFileError for a task
    that could never be scored.
    """
    check_task(task)
    final_url = page.url
    limits = _Limits(locator_timeout_s, navigation_timeout_s, settle_timeout_s)
    fuzzy: list[_Fuzzy] = []
    checks: list[_Check] = []
    for kind in dict.fromkeys(task.eval.eval_types):
        if kind == "string_match":
            checks += _string_checks(task, answer, fuzzy)
        elif kind == "url_match":
            checks.append(_url_check(task, final_url, urls))
        elif kind == "program_html":
            checks += await _program_html_checks(
                task, page, final_url=final_url, urls=urls, limits=limits, fuzzy=fuzzy
            )
        elif kind == "orm":
            checks.append(_Check(kind="orm", passed=None, detail=ORM_PENDING))
    await _judge(fuzzy, judge, decided_fail=any(c.passed is False for c in checks))
    return evaluation_of([EvalCheck(kind=c.kind, passed=c.passed, detail=c.detail) for c in checks])


def evaluation_of(checks: list[EvalCheck]) -> Evaluation:
    """The product of the checks: reward 1 only when there are some and every one passed;
    `unjudged` when one could not be judged and none failed."""
    failed = any(c.passed is False for c in checks)
    unknown = any(c.passed is None for c in checks)
    reward = 1.0 if checks and not failed and not unknown else 0.0
    return Evaluation(reward=reward, checks=checks, unjudged=unknown and not failed)
