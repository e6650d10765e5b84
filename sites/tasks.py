"""WebArena task files: loading, checking, placeholders, multi-tab start URLs, writing.

A task file is what WebArena and WebArena-Lite ship: a JSON list of task objects
(`config_files/test.raw.json`, `test_webarena_lite.raw.json`), one task object, or a
directory of `N.json` files (what WebArena's `generate_test_data.py` writes). The Structs
are `runtime.base.messages.TaskConfig` and friends; unknown fields survive a round trip.

Loading checks more than types: every evaluator named in `eval.eval_types` must have what
it needs (reference answers with known rules, a reference URL with a known `url_note`,
`program_html` entries with a URL and known `required_contents` rules), and placeholders
must be known names. Any problem raises `TaskFileError` naming the file, the task ("task
12", or "item 3" when the id itself is broken) and the field path. Evaluator helper
functions (`func:...`) are only parsed here; `sites.evaluators.unsupported` says which of
them this project cannot run.

Placeholders (`__SHOPPING__`, ...) are replaced in `start_url`, `eval.reference_url` and
`eval.program_html[].url` from a mapping of site URLs keyed by WebArena's environment
variable names (SHOPPING, SHOPPING_ADMIN, REDDIT, GITLAB, MAP, WIKIPEDIA, HOMEPAGE).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
from msgspec import UNSET

from runtime.base.files import write_atomic
from runtime.base.messages import (
    EvalSpec,
    ProgramHtmlCheck,
    ReferenceAnswers,
    TaskConfig,
    decode_task,
    encode_tasks,
)
from sites.errors import PlaceholderError, TaskFileError
from sites.matching import EXACT, GOLD_IN_PRED, parse_required_value

__all__ = [
    "ANSWER_RULES",
    "CONTENT_RULES",
    "EVAL_TYPES",
    "PLACEHOLDERS",
    "FuncCall",
    "TaskCounts",
    "answer_rules",
    "check_task",
    "content_rules",
    "count_tasks",
    "load_tasks",
    "parse_func",
    "parse_tasks",
    "rule_values",
    "start_urls",
    "substitute",
    "substitute_task",
    "write_tasks",
]

PLACEHOLDERS = ("SHOPPING", "SHOPPING_ADMIN", "REDDIT", "GITLAB", "MAP", "WIKIPEDIA", "HOMEPAGE")
# "orm": no evaluator of its own; WebRL's outcome reward model judges the episode after it
# ends (`runtime.labeling`; left unjudged where none is configured).
EVAL_TYPES = ("string_match", "url_match", "program_html", "orm")
ANSWER_RULES = (
    "exact_match",
    "must_include",
    "must_exclude",
    "one_of",
    "required_values",
    "fuzzy_match",
)
CONTENT_RULES = ANSWER_RULES
PAGE_ARG = "__page__"
LAST_URL = "__last_url__"

_PLACEHOLDER = re.compile(r"__([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*)__")
_AND = " |AND| "
_FILE_NUMBER = re.compile(r"^(\d+)\.json$")


# --------------------------------------------------------------------------- placeholders


def substitute(text: str, urls: Mapping[str, str]) -> str:
    """`text` with every `__NAME__` replaced by `urls[NAME]` (without a trailing slash).

    Raises PlaceholderError naming the first placeholder that `urls` does not resolve.
    """

    def replace(match: re.Match[str]) -> str:
        name = match[1]
        if name not in urls:
            raise PlaceholderError(match[0], text, sorted(urls))
        return urls[name].rstrip("/")

    return _PLACEHOLDER.sub(replace, text)


def substitute_task(task: TaskConfig, urls: Mapping[str, str]) -> TaskConfig:
    """The task with placeholders replaced in its start, reference and program_html URLs."""
    spec = task.eval
    changes: dict[str, Any] = {}
    if isinstance(spec.reference_url, str):
        changes["reference_url"] = substitute(spec.reference_url, urls)
    if isinstance(spec.program_html, list):
        changes["program_html"] = [
            msgspec.structs.replace(check, url=substitute(check.url, urls))
            for check in spec.program_html
        ]
    return msgspec.structs.replace(
        task,
        start_url=substitute(task.start_url, urls),
        eval=msgspec.structs.replace(spec, **changes),
    )


def start_urls(task: TaskConfig) -> list[str]:
    """The URLs to open, one tab each: WebArena joins several with ` |AND| `."""
    return [url.strip() for url in task.start_url.split(_AND) if url.strip()]


# --------------------------------------------------------------------------- helper calls


class FuncCall(NamedTuple):
    """A parsed `func:name(args)`: string arguments, or PAGE_ARG for `__page__`."""

    name: str
    args: tuple[str, ...]


def parse_func(text: str) -> FuncCall:
    """Parse WebArena's `func:name('a', __page__)` without evaluating anything.

    Raises ValueError when the text is not a call of a plain name with string literal or
    `__page__` arguments.
    """
    source = text.strip().removeprefix("func:")
    try:
        node = ast.parse(source, mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"not a helper call: {text!r} ({exc.msg})") from exc
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.keywords:
        raise ValueError(f"not a helper call name(args...): {text!r}")
    args: list[str] = []
    for arg in node.args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            args.append(arg.value)
        elif isinstance(arg, ast.Name) and arg.id == PAGE_ARG:
            args.append(PAGE_ARG)
        else:
            raise ValueError(f"helper arguments must be string literals or __page__: {text!r}")
    return FuncCall(node.func.id, tuple(args))


# --------------------------------------------------------------------------- rules


def answer_rules(answers: ReferenceAnswers) -> dict[str, Any]:
    """The string_match rules a task sets (absent and null ones left out), in rule order."""
    present = {name: getattr(answers, name) for name in ANSWER_RULES}
    return {
        name: value for name, value in present.items() if value is not UNSET and value is not None
    }


def content_rules(required: object) -> dict[str, Any]:
    """The rules of a program_html entry's `required_contents` object (nulls left out)."""
    if not isinstance(required, dict):
        return {}
    return {name: value for name, value in required.items() if value is not None}


def rule_values(value: object) -> list[str]:
    """A rule's value as a list of strings: a bare value is a one-element list."""
    items = value if isinstance(value, list) else [value]
    return [item if isinstance(item, str) else str(item) for item in items]


def _rule_problems(prefix: str, rules: dict[str, Any]) -> Iterator[tuple[str, str]]:
    if not rules:
        yield prefix, f"no rule set (one of: {', '.join(ANSWER_RULES)})"
    for name, value in rules.items():
        field = f"{prefix}.{name}"
        if name not in ANSWER_RULES:
            yield field, f"unknown rule (known: {', '.join(ANSWER_RULES)})"
            continue
        scalar = (str, int, float)
        if isinstance(value, bool) or not isinstance(value, (*scalar, list)):
            yield field, f"expected a string or a list of strings, got {type(value).__name__}"
            continue
        if name == "exact_match" and isinstance(value, list):
            yield field, "expected one string, got a list"
            continue
        values = value if isinstance(value, list) else [value]
        if not values:
            yield field, "empty list"
        for i, item in enumerate(values):
            where = f"{field}[{i}]" if isinstance(value, list) else field
            if isinstance(item, bool) or not isinstance(item, scalar):
                yield where, f"expected a string, got {type(item).__name__}"
            elif isinstance(item, str) and not item.strip():
                yield where, "empty string"
            elif name == "required_values":
                try:
                    parse_required_value(str(item))
                except ValueError as exc:
                    yield where, str(exc)


def _url_problems(field: str, url: str) -> Iterator[tuple[str, str]]:
    for match in _PLACEHOLDER.finditer(url):
        if match[1] not in PLACEHOLDERS:
            known = ", ".join(f"__{p}__" for p in PLACEHOLDERS)
            yield field, f"unknown placeholder {match[0]} (known: {known})"


def _program_html_problems(spec: EvalSpec) -> Iterator[tuple[str, str]]:
    entries = spec.program_html
    if not isinstance(entries, list) or not entries:
        yield "eval.program_html", "program_html is listed in eval_types but has no entries"
        return
    for i, entry in enumerate(entries):
        yield from _entry_problems(f"eval.program_html[{i}]", entry)


def _entry_problems(prefix: str, entry: ProgramHtmlCheck) -> Iterator[tuple[str, str]]:
    if not entry.url.strip():
        yield f"{prefix}.url", "empty (use 'last' for the page the agent ended on)"
    elif entry.url.startswith("func:"):
        try:
            parse_func(entry.url)
        except ValueError as exc:
            yield f"{prefix}.url", str(exc)
    else:
        yield from _url_problems(f"{prefix}.url", entry.url)
    if entry.locator.startswith("func:"):
        try:
            parse_func(entry.locator)
        except ValueError as exc:
            yield f"{prefix}.locator", str(exc)
    required = entry.required_contents
    if not isinstance(required, dict):
        got = "nothing" if required is UNSET else type(required).__name__
        yield f"{prefix}.required_contents", f"expected an object of rules, got {got}"
        return
    yield from _rule_problems(f"{prefix}.required_contents", content_rules(required))


def _problems(task: TaskConfig) -> Iterator[tuple[str, str]]:
    """(field, problem) for everything that keeps the task from being run and scored."""
    if not start_urls(task):
        yield "start_url", "empty"
    yield from _url_problems("start_url", task.start_url)
    spec = task.eval
    if not spec.eval_types:
        yield "eval.eval_types", "empty: the task has no evaluator"
    for i, kind in enumerate(spec.eval_types):
        if kind not in EVAL_TYPES:
            yield (
                f"eval.eval_types[{i}]",
                f"unknown evaluator {kind!r} (known: {', '.join(EVAL_TYPES)})",
            )
    kinds = set(spec.eval_types)
    if "string_match" in kinds:
        answers = spec.reference_answers
        if not isinstance(answers, ReferenceAnswers):
            yield "eval.reference_answers", "string_match needs reference answers"
        else:
            rules = answer_rules(answers) | dict(answers.extra_fields)
            yield from _rule_problems("eval.reference_answers", rules)
    if "url_match" in kinds:
        if not isinstance(spec.reference_url, str) or not spec.reference_url.strip():
            yield "eval.reference_url", "url_match needs a reference URL"
        else:
            yield from _url_problems("eval.reference_url", spec.reference_url)
        note = spec.url_note
        if isinstance(note, str) and note not in ("", GOLD_IN_PRED, EXACT):
            yield "eval.url_note", f"unknown rule {note!r} (known: {GOLD_IN_PRED!r}, {EXACT!r})"
    if "program_html" in kinds:
        yield from _program_html_problems(spec)


def _label(task_id: object, index: int) -> str:
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        return f"task {task_id}"
    return f"item {index}"


def check_task(task: TaskConfig, *, source: str = "<task>", index: int = 0) -> None:
    """Raise TaskFileError for the first problem that keeps `task` from being scored."""
    for field, problem in _problems(task):
        raise TaskFileError(source, _label(task.task_id, index), field, problem)


# --------------------------------------------------------------------------- loading

_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")


def _explain(exc: msgspec.ValidationError) -> tuple[str, str]:
    """msgspec's message as (field path, problem): `$.eval.x[2]` -> `eval.x[2]`."""
    match = _AT.match(str(exc))
    what, path = (
        (match["what"], (match["path"] or "").removeprefix(".")) if match else (str(exc), "")
    )
    missing = _MISSING.match(what)
    if missing:
        name = missing["name"]
        return (f"{path}.{name}" if path else name), "missing required field"
    problem = (what[:1].lower() + what[1:]).replace("`", "")
    return path or "(top level)", problem


def parse_tasks(
    data: bytes | str, *, source: str, urls: Mapping[str, str] | None = None
) -> list[TaskConfig]:
    """Tasks from one JSON document (a list of task objects or one object).

    With `urls`, placeholders are replaced (an unresolved one is an error). Raises
    TaskFileError naming `source`, the task and the field.
    """
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise TaskFileError(source, "", "", f"not valid JSON ({exc})") from exc
    except RecursionError as exc:  # msgspec's depth limit: 10^5 nested brackets
        raise TaskFileError(source, "", "", "JSON nested too deeply to be a task file") from exc
    items = raw if isinstance(raw, list) else [raw]
    tasks: list[TaskConfig] = []
    seen: dict[int, int] = {}
    for index, item in enumerate(items):
        label = _label(item.get("task_id") if isinstance(item, dict) else None, index)
        if not isinstance(item, dict):
            raise TaskFileError(
                source, label, "", f"expected a task object, got {type(item).__name__}"
            )
        try:
            task = decode_task(item)
        except msgspec.ValidationError as exc:
            field, problem = _explain(exc)
            raise TaskFileError(source, label, field, problem) from exc
        if task.task_id in seen:
            raise TaskFileError(
                source,
                f"item {index}",
                "task_id",
                f"duplicate id {task.task_id} (also item {seen[task.task_id]})",
            )
        seen[task.task_id] = index
        check_task(task, source=source, index=index)
        tasks.append(_substituted(task, urls, source, label) if urls is not None else task)
    return tasks


def _substituted(task: TaskConfig, urls: Mapping[str, str], source: str, label: str) -> TaskConfig:
    fields = [("start_url", task.start_url)]
    if isinstance(task.eval.reference_url, str):
        fields.append(("eval.reference_url", task.eval.reference_url))
    for i, entry in enumerate(task.eval.program_html or []):
        fields.append((f"eval.program_html[{i}].url", entry.url))
    for field, text in fields:
        try:
            substitute(text, urls)
        except PlaceholderError as exc:
            raise TaskFileError(source, label, field, str(exc)) from exc
    return substitute_task(task, urls)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TaskFileError(str(path), "", "", f"cannot read ({exc.strerror})") from exc


def load_tasks(path: str | Path, *, urls: Mapping[str, str] | None = None) -> list[TaskConfig]:
    """Tasks from a JSON file or a directory of WebArena's `N.json` files (by number).

    Task ids must be unique across the whole directory.
    """
    path = Path(path)
    if not path.is_dir():
        return parse_tasks(_read(path), source=str(path), urls=urls)
    numbered = sorted(
        (int(m[1]), child)
        for child in path.iterdir()
        if (m := _FILE_NUMBER.match(child.name)) and child.is_file()
    )
    if not numbered:
        raise TaskFileError(str(path), "", "", "directory holds no N.json task files")
    tasks: list[TaskConfig] = []
    where: dict[int, Path] = {}
    for _, child in numbered:
        for task in parse_tasks(_read(child), source=str(child), urls=urls):
            if task.task_id in where:
                raise TaskFileError(
                    str(child),
                    f"task {task.task_id}",
                    "task_id",
                    f"duplicate id (also in {where[task.task_id]})",
                )
            where[task.task_id] = child
            tasks.append(task)
    return tasks


def write_tasks(path: str | Path, tasks: Sequence[TaskConfig]) -> None:
    """Write tasks as a sorted-key JSON list atomically (temp file, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, encode_tasks(list(tasks)))  # 0644: ordinary readable data


# --------------------------------------------------------------------------- counts


class TaskCounts(NamedTuple):
    """How many tasks per site combination, per evaluator, and per string/content rule."""

    total: int
    by_site: dict[str, int]
    by_eval_type: dict[str, int]
    by_rule: dict[str, int]


def count_tasks(tasks: Sequence[TaskConfig]) -> TaskCounts:
    """Counts for `webagent tasks check` / `stats`; several sites are sorted and joined with '+'."""
    sites: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    rules: Counter[str] = Counter()
    for task in tasks:
        sites["+".join(sorted(task.sites)) or "(none)"] += 1
        kinds.update(dict.fromkeys(task.eval.eval_types, 1))
        found: set[str] = set()
        if "string_match" in task.eval.eval_types and isinstance(
            task.eval.reference_answers, ReferenceAnswers
        ):
            found.update(f"string_match.{r}" for r in answer_rules(task.eval.reference_answers))
        if "program_html" in task.eval.eval_types:
            for entry in task.eval.program_html or []:
                found.update(f"program_html.{r}" for r in content_rules(entry.required_contents))
        rules.update(found)
    return TaskCounts(
        total=len(tasks),
        by_site=dict(sorted(sites.items())),
        by_eval_type=dict(sorted(kinds.items())),
        by_rule=dict(sorted(rules.items())),
    )
