"""Loading WebArena task files: every field variant, placeholders, tabs, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtime.base.messages import ReferenceAnswers, encode_tasks
from sites.errors import PlaceholderError, TaskFileError
from sites.tasks import (
    PAGE_ARG,
    FuncCall,
    count_tasks,
    load_tasks,
    parse_func,
    parse_tasks,
    start_urls,
    substitute,
    substitute_task,
    write_tasks,
)

FIXTURE = Path(__file__).parent / "fixtures" / "webarena_tasks.json"
URLS = {
    "SHOPPING": "http://shop.test:7770",
    "SHOPPING_ADMIN": "http://shop.test:7780/admin/",  # a trailing slash is dropped
    "REDDIT": "http://forum.test:9999",
    "GITLAB": "http://code.test:8023",
    "MAP": "http://map.test:3000",
    "WIKIPEDIA": "http://wiki.test:8888",
    "HOMEPAGE": "http://home.test:4399",
}


def _raw() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(FIXTURE.read_text())
    return data


def _write(tmp_path: Path, data: Any, name: str = "tasks.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_fixture_loads_every_variant() -> None:
    tasks = load_tasks(FIXTURE)
    assert [t.task_id for t in tasks] == list(range(13))
    by_id = {t.task_id: t for t in tasks}
    assert by_id[2].storage_state is None and by_id[2].require_login is False
    assert by_id[3].eval.string_note == "No kettle was ever returned"
    assert by_id[1].eval.extra_fields == {"annotation_note": "no refunds that month"}
    assert by_id[10].extra_fields == {"old_task_id": 293, "string_note": "only one other member"}
    answers = by_id[10].eval.reference_answers
    assert isinstance(answers, ReferenceAnswers) and answers.must_include == "yjlou"
    assert by_id[12].intent_template_id == "map-zoom"
    assert by_id[9].eval.program_html[0].prep_actions == [  # type: ignore[index]
        "document.querySelector('.order-details-toggle').click()"
    ]
    counts = count_tasks(tasks)
    assert counts.total == 13
    assert counts.by_site["map+wikipedia"] == 1 and counts.by_site["gitlab"] == 3
    assert counts.by_eval_type == {"program_html": 4, "string_match": 6, "url_match": 5}
    assert counts.by_rule["string_match.fuzzy_match"] == 2
    assert counts.by_rule["program_html.fuzzy_match"] == 1


def test_round_trip_is_byte_for_byte_with_sorted_keys(tmp_path: Path) -> None:
    raw = _raw()
    raw[0]["reviewer"] = {"name": "x", "minutes": 3}  # unknown fields at every level
    raw[0]["eval"]["grader"] = "v2"
    raw[6]["eval"]["program_html"][1]["note"] = "wish list grid"
    path = _write(tmp_path, raw)
    expected = json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    once = encode_tasks(load_tasks(path))
    assert once.decode() == expected
    assert encode_tasks(parse_tasks(once, source="again")) == once


def test_substitution_in_start_reference_and_program_html_urls() -> None:
    tasks = {t.task_id: t for t in load_tasks(FIXTURE, urls=URLS)}
    assert tasks[0].start_url == "http://shop.test:7780/admin"
    assert tasks[4].eval.reference_url == (
        "http://forum.test:9999/f/books |OR| http://forum.test:9999/f/literature"
    )
    html = tasks[6].eval.program_html
    assert html is not None and not isinstance(html, type(None))
    assert [e.url for e in html] == ["last", "http://shop.test:7770/wishlist/"]  # type: ignore[union-attr]
    assert tasks[7].eval.program_html[0].url == "func:reddit_get_post_url('__last_url__')"  # type: ignore[index]
    # Locators keep their BEM double underscores untouched.
    assert "submission__inner" in tasks[7].eval.program_html[0].locator  # type: ignore[index]
    assert start_urls(tasks[6]) == [
        "http://shop.test:7770/steel-kettle.html",
        "http://shop.test:7770/glass-kettle.html",
    ]
    assert start_urls(tasks[12]) == ["http://wiki.test:8888", "http://map.test:3000"]


def test_substitute_names_an_unresolved_placeholder() -> None:
    assert substitute("__SHOPPING_ADMIN__/x", {"SHOPPING_ADMIN": "http://a/"}) == "http://a/x"
    with pytest.raises(PlaceholderError, match=r"__WIKIPEDIA__ in '__WIKIPEDIA__ \|AND\| __MAP__'"):
        substitute("__WIKIPEDIA__ |AND| __MAP__", {"MAP": "http://m"})
    task = load_tasks(FIXTURE)[12]
    with pytest.raises(PlaceholderError, match="site URLs: MAP"):
        substitute_task(task, {"MAP": "http://m"})


def test_load_with_missing_site_url_names_file_task_and_field() -> None:
    urls = {k: v for k, v in URLS.items() if k != "GITLAB"}
    with pytest.raises(TaskFileError) as info:
        load_tasks(FIXTURE, urls=urls)
    assert str(info.value).startswith(f"{FIXTURE}: task 5: start_url: no URL for")
    assert "__GITLAB__" in str(info.value)
    # The field is the one holding the placeholder, wherever it is.
    raw = _raw()[5]
    raw["start_url"] = "__MAP__"
    with pytest.raises(
        TaskFileError, match=r"task 5: eval\.reference_url: no URL for placeholder __GITLAB__"
    ):
        parse_tasks(json.dumps(raw), source="one.json", urls=urls)


def _broken(mutate: Any) -> list[dict[str, Any]]:
    raw = _raw()
    mutate(raw)
    return raw


def _set(path: str, value: Any, index: int = 3) -> Any:
    def mutate(raw: list[dict[str, Any]]) -> None:
        node: Any = raw[index]
        keys = path.split(".")
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        last = keys[-1]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


BROKEN = [
    # (mutation, task label, field, words of the problem)
    (_set("task_id", "three"), "item 3", "task_id", "expected int, got str"),
    (_set("intent", None), "task 3", "intent", "expected str, got null"),
    (
        _set("eval.eval_types", ["string_match", "page_image_query"]),
        "task 3",
        "eval.eval_types[1]",
        "unknown evaluator",
    ),
    (_set("eval.eval_types", []), "task 3", "eval.eval_types", "no evaluator"),
    (
        _set("eval.reference_answers", None),
        "task 3",
        "eval.reference_answers",
        "needs reference answers",
    ),
    (
        _set("eval.reference_answers", {"weird_rule": ["x"]}),
        "task 3",
        "eval.reference_answers.weird_rule",
        "unknown rule",
    ),
    (
        _set("eval.reference_answers", {"must_include": []}),
        "task 3",
        "eval.reference_answers.must_include",
        "empty list",
    ),
    (
        _set("eval.reference_answers", {"must_include": ["ok", " "]}),
        "task 3",
        "eval.reference_answers.must_include[1]",
        "empty string",
    ),
    (
        _set("eval.reference_answers", {"required_values": ["about 5"]}),
        "task 3",
        "eval.reference_answers.required_values[0]",
        "not a comparison",
    ),
    (
        _set("eval.reference_answers", {"exact_match": ["a", "b"]}),
        "task 3",
        "eval.reference_answers.exact_match",
        "got array",
    ),
    (
        _set("eval.reference_answers", ["announcements Art"]),
        "task 3",
        "eval.reference_answers",
        "expected object | null, got array",
    ),
    (_set("eval.reference_url", "", 4), "task 4", "eval.reference_url", "needs a reference URL"),
    (_set("eval.url_note", "PRED in GOLD", 4), "task 4", "eval.url_note", "unknown rule"),
    (
        _set("eval.reference_url", "__SHOPING__/x", 4),
        "task 4",
        "eval.reference_url",
        "unknown placeholder __SHOPING__",
    ),
    (_set("start_url", "  "), "task 3", "start_url", "empty"),
    (_set("eval.program_html", [], 8), "task 8", "eval.program_html", "has no entries"),
    (
        _set("eval.program_html.0.required_contents", [], 8),
        "task 8",
        "eval.program_html[0].required_contents",
        "expected an object of rules, got list",
    ),
    (
        _set("eval.program_html.0.required_contents", {"must_contain": ["x"]}, 8),
        "task 8",
        "eval.program_html[0].required_contents.must_contain",
        "unknown rule",
    ),
    (_set("eval.program_html.0.url", "", 8), "task 8", "eval.program_html[0].url", "use 'last'"),
    (
        _set("eval.program_html.0.url", "func:__import__('os').system('x')", 8),
        "task 8",
        "eval.program_html[0].url",
        "not a helper call",
    ),
    (
        _set("eval.program_html.0.locator", "func:role(page.url)", 8),
        "task 8",
        "eval.program_html[0].locator",
        "string literals or __page__",
    ),
    (
        _set("eval.program_html.0.prep_actions", "click()", 9),
        "task 9",
        "eval.program_html[0].prep_actions",
        "expected array",
    ),
    (_set("task_id", 2, 5), "item 5", "task_id", "duplicate id 2 (also item 2)"),
]


@pytest.mark.parametrize(("mutate", "label", "field", "problem"), BROKEN)
def test_broken_task_names_file_task_and_field(
    tmp_path: Path, mutate: Any, label: str, field: str, problem: str
) -> None:
    path = _write(tmp_path, _broken(mutate))
    with pytest.raises(TaskFileError) as info:
        load_tasks(path)
    error = info.value
    assert (error.source, error.task, error.field) == (str(path), label, field)
    assert problem in error.problem
    assert str(error) == f"{path}: {label}: {field}: {error.problem}"
    assert "\n" not in str(error)


def test_unusable_documents(tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('[{"task_id": 1,')
    with pytest.raises(TaskFileError, match=r"bad\.json: not valid JSON"):
        load_tasks(bad_json)
    with pytest.raises(TaskFileError, match=r"item 1: expected a task object, got int"):
        load_tasks(_write(tmp_path, [_raw()[0], 7]))
    with pytest.raises(TaskFileError, match=r"missing\.json: cannot read"):
        load_tasks(tmp_path / "missing.json")
    one = load_tasks(_write(tmp_path, _raw()[4], "one.json"))  # a single task object
    assert [t.task_id for t in one] == [4]


def test_directory_of_numbered_files(tmp_path: Path) -> None:
    raw = _raw()
    for i in (10, 2, 0):
        _write(tmp_path, raw[i], f"{i}.json")
    _write(tmp_path, raw, "test.raw.json")  # WebArena keeps these beside N.json: ignored
    (tmp_path / "examples").mkdir()
    assert [t.task_id for t in load_tasks(tmp_path)] == [0, 2, 10]
    _write(tmp_path, raw[2], "11.json")
    with pytest.raises(TaskFileError, match=r"11\.json: task 2: task_id: duplicate id \(also in "):
        load_tasks(tmp_path)
    with pytest.raises(TaskFileError, match=r"holds no N\.json task files"):
        load_tasks(tmp_path / "examples")


def test_write_tasks_is_atomic_and_reloadable(tmp_path: Path) -> None:
    tasks = load_tasks(FIXTURE)
    out = tmp_path / "split" / "test.json"
    write_tasks(out, tasks)
    write_tasks(out, tasks[:2])  # replaces, never appends or leaves temp files
    assert load_tasks(out) == tasks[:2]
    assert [p.name for p in out.parent.iterdir()] == ["test.json"]


def test_parse_func_never_evaluates() -> None:
    assert parse_func("func:reddit_get_post_url('__last_url__')") == FuncCall(
        "reddit_get_post_url", ("__last_url__",)
    )
    assert parse_func("func:gitlab_get_project_memeber_role(__page__, 'yjlou')") == FuncCall(
        "gitlab_get_project_memeber_role", (PAGE_ARG, "yjlou")
    )
    assert parse_func("func:shopping_get_latest_order_url()").args == ()
    for bad in ("func:x(", "func:os.system('x')", "func:f(a=1)", "func:f(1)", "func:f"):
        with pytest.raises(ValueError, match=r"helper"):
            parse_func(bad)
