"""`evaluate` end to end in real Chromium against pages served on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.async_api import BrowserContext, Page
from playwright.async_api import Error as PlaywrightError

from runtime.base.messages import Evaluation, TaskConfig, decode_task
from sites.errors import PageClosedError, PageError
from sites.evaluators import evaluate, unsupported
from sites.judge import HttpJudge
from sites.tasks import load_tasks

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

FIXTURE = Path(__file__).parent / "fixtures" / "webarena_tasks.json"

_POST = (
    '<div class="submission__inner"><h1>Virtual book club</h1>'
    "<p>Join our virtual meetup on July 8th!</p></div>"
)
_MEMBERS = """<table><tbody>
<tr><td data-label="Account"><span class="gl-avatar-labeled-sublabel">@yjlou</span></td>
    <td class="col-max-role"><span>Developer</span></td></tr>
<tr><td data-label="Account"><span class="gl-avatar-labeled-sublabel">@byteblaze</span></td>
    <td class="col-max-role"><span>Maintainer</span></td></tr>
</tbody></table>"""
PAGES = {
    "/f/books": "<h1>books</h1><a href='/f/books/12/virtual-book-club'>Virtual book club</a>",
    "/f/books/12": _POST,
    "/f/books/12/virtual-book-club/comment/3": _POST + "<div class='comment'>See you!</div>",
    "/wishlist": '<h1 class="page-title">My  Wish\nList</h1>'
    '<div class="products-grid">Glass Kettle 1.5L<br>$19.99</div>',
    "/acme/tracker/-/project_members": _MEMBERS,
    "/order": '<button class="order-details-toggle" '
    "onclick=\"document.querySelector('.order-status').textContent='Canceled'\">details</button>"
    '<div class="order-status"></div>',
    "/entities": '<div id="t">Tom &amp; Jerry</div>',
    "/price": '<span id="total">$0.00</span> <span id="count">Items: 3</span>',
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        body = PAGES.get(path)
        status = 200 if body is not None else 404
        data = f"<!doctype html><title>{path}</title><body>{body or 'not found'}</body>".encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def urls(base: str) -> dict[str, str]:
    names = ("SHOPPING", "SHOPPING_ADMIN", "REDDIT", "GITLAB", "MAP", "WIKIPEDIA", "HOMEPAGE")
    return dict.fromkeys(names, base)


@pytest.fixture
def tasks() -> dict[int, TaskConfig]:
    return {task.task_id: task for task in load_tasks(FIXTURE)}


@pytest.fixture
async def page(context: BrowserContext) -> Page:
    return await context.new_page()


def _task(eval_spec: dict[str, Any], intent: str = "Check the page") -> TaskConfig:
    return decode_task(
        {"task_id": 99, "intent": intent, "start_url": "__SHOPPING__", "eval": eval_spec}
    )


def _html_task(*entries: dict[str, Any]) -> TaskConfig:
    return _task({"eval_types": ["program_html"], "program_html": list(entries)})


class _Judge:
    """An HttpJudge on an httpx.MockTransport that records the prompts it was sent."""

    def __init__(self, reply: str | Callable[[str], httpx.Response]) -> None:
        self.prompts: list[str] = []

        def handler(request: httpx.Request) -> httpx.Response:
            prompt = json.loads(request.content)["messages"][-1]["content"]
            self.prompts.append(prompt)
            if callable(reply):
                return reply(prompt)
            return httpx.Response(200, json={"choices": [{"message": {"content": reply}}]})

        self.client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        self.judge = HttpJudge(self.client, url="http://judge.test", model="m")


# --------------------------------------------------------------------------- string_match


async def test_string_rules(page: Page, tasks: dict[int, TaskConfig], urls: dict[str, str]) -> None:
    async def score(task: TaskConfig, answer: str | None) -> float:
        return (await evaluate(task, answer=answer, page=page, urls=urls)).reward

    assert await score(tasks[0], '"yoga mat pro™"') == 1.0
    assert await score(tasks[0], "Yoga Mat Pro™ and more") == 0.0
    assert await score(tasks[1], "You spent $0.00 on refunds") == 1.0
    assert await score(tasks[1], "You spent $10.00 on refunds") == 0.0
    assert await score(tasks[10], "Only yjlou.") == 1.0  # WebArena-Lite's bare-string must_include
    # must_exclude, one_of, required_values
    assert await score(tasks[11], "3 items") == 1.0
    assert await score(tasks[11], "3 items and a gift card") == 0.0
    assert await score(tasks[11], "three items") == 0.0  # required_values needs a number
    assert await score(tasks[11], "4 items") == 0.0  # one_of fails
    none = await evaluate(tasks[0], answer=None, page=page, urls=urls)
    assert none.reward == 0.0 and not none.unjudged
    assert none.checks[0].detail.startswith("no answer")


async def test_fuzzy_without_judge_is_unjudged(
    page: Page, tasks: dict[int, TaskConfig], urls: dict[str, str]
) -> None:
    result = await evaluate(tasks[2], answer="Riverside Park, 12 min on foot", page=page, urls=urls)
    assert result.reward == 0.0 and result.unjudged
    assert [(c.kind, c.passed) for c in result.checks] == [
        ("string_match.must_include", True),
        ("string_match.fuzzy_match", None),
    ]
    assert "no fuzzy-match judge" in result.checks[1].detail


async def test_fuzzy_with_judge(
    page: Page, tasks: dict[int, TaskConfig], urls: dict[str, str]
) -> None:
    grader = _Judge("Same duration. correct")
    async with grader.client:
        good = await evaluate(
            tasks[2],
            answer="Riverside Park, 12 min on foot",
            page=page,
            urls=urls,
            judge=grader.judge,
        )
        assert good.reward == 1.0 and not good.unjudged
        assert len(grader.prompts) == 1 and "walking: 12min" in grader.prompts[0]
        # A failed string rule decides the reward: the judge is not asked.
        bad = await evaluate(
            tasks[2], answer="Central Park, 12 min", page=page, urls=urls, judge=grader.judge
        )
    assert bad.reward == 0.0 and not bad.unjudged
    assert len(grader.prompts) == 1
    assert bad.checks[1].passed is None and bad.checks[1].detail.startswith("not judged")


async def test_na_answers(page: Page, tasks: dict[int, TaskConfig], urls: dict[str, str]) -> None:
    unachievable, achievable = tasks[3], tasks[2]
    assert (await evaluate(unachievable, answer="N/A", page=page, urls=urls)).reward == 1.0
    reasoned = await evaluate(unachievable, answer="Nobody returned kettles", page=page, urls=urls)
    assert reasoned.reward == 0.0 and reasoned.unjudged
    grader = _Judge("same")
    async with grader.client:
        judged = await evaluate(
            unachievable, answer="Nobody returned kettles", page=page, urls=urls, judge=grader.judge
        )
        assert judged.reward == 1.0
        assert "Actual reason: No kettle was ever returned" in grader.prompts[0]
        # "N/A" for a task that has an answer fails without asking anyone.
        wrong = await evaluate(achievable, answer="n/a", page=page, urls=urls, judge=grader.judge)
    assert wrong.reward == 0.0 and not wrong.unjudged and len(grader.prompts) == 1
    assert "answered 'N/A' but the task has an answer" in wrong.checks[-1].detail


async def test_failing_judge_leaves_the_check_unjudged(
    page: Page, tasks: dict[int, TaskConfig], urls: dict[str, str]
) -> None:
    grader = _Judge(lambda prompt: httpx.Response(500, text="overloaded"))
    async with grader.client:
        result = await evaluate(
            tasks[2], answer="Riverside Park, 12 min", page=page, urls=urls, judge=grader.judge
        )
    assert result.reward == 0.0 and result.unjudged
    assert "answered 500: overloaded" in result.checks[1].detail


# --------------------------------------------------------------------------- url_match


async def test_url_match_on_the_final_page(
    page: Page, tasks: dict[int, TaskConfig], urls: dict[str, str], base: str
) -> None:
    await page.goto(f"{base}/f/books/12/virtual-book-club")
    assert (await evaluate(tasks[4], answer=None, page=page, urls=urls)).reward == 1.0
    await page.goto(f"{base}/f/book")
    result = await evaluate(tasks[4], answer=None, page=page, urls=urls)
    assert result.reward == 0.0
    assert result.checks[0].kind == "url_match" and "does not match" in result.checks[0].detail
    await page.goto(f"{base}/acme/tracker/-/issues?state=opened&label_name[]=bug&sort=new")
    assert (await evaluate(tasks[5], answer=None, page=page, urls=urls)).reward == 1.0
    await page.goto(f"{base}/acme/tracker/-/issues?state=opened")
    assert (await evaluate(tasks[5], answer=None, page=page, urls=urls)).reward == 0.0


# --------------------------------------------------------------------------- program_html


async def test_last_page_and_navigation(
    page: Page, tasks: dict[int, TaskConfig], urls: dict[str, str], base: str
) -> None:
    await page.goto(f"{base}/wishlist/")
    good = await evaluate(tasks[6], answer=None, page=page, urls=urls)
    assert good.reward == 1.0, good.checks
    assert [c.kind for c in good.checks] == [
        "url_match",
        "program_html[0].exact_match",
        "program_html[1].must_include",
    ]
    await page.goto(f"{base}/f/books")
    bad = await evaluate(tasks[6], answer=None, page=page, urls=urls)
    assert [c.passed for c in bad.checks] == [False, False, True]


async def test_last_entries_run_before_navigation(
    page: Page, urls: dict[str, str], base: str
) -> None:
    task = _html_task(
        {
            "url": "__SHOPPING__/entities",
            "locator": "document.title",
            "required_contents": {"exact_match": "/entities"},
        },
        {
            "url": "last",
            "locator": "document.title",
            "required_contents": {"exact_match": "/wishlist"},
        },
    )
    await page.goto(f"{base}/wishlist")
    result = await evaluate(task, answer=None, page=page, urls=urls)
    assert result.reward == 1.0, result.checks
    assert page.url == f"{base}/entities"


async def test_reddit_post_url_helper_and_fuzzy_content(
    page: Page, tasks: dict[int, TaskConfig], urls: dict[str, str], base: str
) -> None:
    await page.goto(f"{base}/f/books/12/virtual-book-club/comment/3")
    grader = _Judge("correct")
    async with grader.client:
        result = await evaluate(tasks[7], answer=None, page=page, urls=urls, judge=grader.judge)
    assert result.reward == 1.0, result.checks
    assert page.url == f"{base}/f/books/12/"
    assert "Reference answer: virtual meetup, July 8th" in grader.prompts[0]
    assert "Join our virtual meetup on July 8th!" in grader.prompts[0]
    assert "comment" not in grader.prompts[0].split("Given answer:")[1]


async def test_gitlab_member_role_helper(
    page: Page, tasks: dict[int, TaskConfig], urls: dict[str, str]
) -> None:
    assert (await evaluate(tasks[8], answer=None, page=page, urls=urls)).reward == 1.0
    raw: dict[str, Any] = json.loads(FIXTURE.read_text())[8]
    raw["eval"]["program_html"][0]["locator"] = (
        "func:gitlab_get_project_memeber_role(__page__, 'yjlou')"
    )
    result = await evaluate(decode_task(raw), answer=None, page=page, urls=urls)
    assert result.reward == 0.0
    assert "'Maintainer' not found in content" in result.checks[0].detail
    assert result.checks[0].detail.endswith("'Developer'")


async def test_rest_helpers_are_unsupported_not_guessed(
    page: Page, tasks: dict[int, TaskConfig], urls: dict[str, str]
) -> None:
    assert unsupported(tasks[9]) == [
        "program_html[0]: unsupported: helper shopping_get_latest_order_url() is not implemented "
        "here (func:shopping_get_latest_order_url())"
    ]
    assert unsupported(tasks[8]) == [] and unsupported(tasks[0]) == []
    result = await evaluate(tasks[9], answer=None, page=page, urls=urls)
    assert result.reward == 0.0 and result.unjudged
    assert result.checks[0].passed is None and "unsupported" in result.checks[0].detail
    assert page.url == "about:blank"


async def test_prep_actions_entities_and_numbers(page: Page, urls: dict[str, str]) -> None:
    async def score(task: TaskConfig) -> Evaluation:
        # Server-rendered pages: no need to wait for the network to settle.
        return await evaluate(task, answer=None, page=page, urls=urls, settle_timeout_s=0)

    order = {
        "url": "__SHOPPING__/order",
        "locator": "document.querySelector('.order-status').outerText",
    }
    without = _html_task({**order, "required_contents": {"exact_match": "Canceled"}})
    assert (await score(without)).reward == 0.0
    prepared = {
        **order,
        "prep_actions": ["document.querySelector('.order-details-toggle').click()"],
    }
    with_prep = _html_task({**prepared, "required_contents": {"exact_match": "Canceled"}})
    assert (await score(with_prep)).reward == 1.0
    entities = _html_task(
        {
            "url": "__SHOPPING__/entities",
            "locator": "",
            "required_contents": {"must_include": ["Tom & Jerry"]},
        },
        {
            "url": "__SHOPPING__/entities",
            "locator": "document.querySelector('#t').innerHTML",
            "required_contents": {"exact_match": "tom & jerry"},
        },
    )
    assert (await score(entities)).reward == 1.0
    price = "document.querySelector('#total').innerText"
    numbers = _html_task(
        {
            "url": "__SHOPPING__/price",
            "locator": price,
            "required_contents": {"required_values": ["== 0"], "must_include": ["0"]},
        },
        {
            "url": "__SHOPPING__/price",
            "locator": "[...document.querySelectorAll('span')].map(s => s.innerText)",
            "required_contents": {"must_include": ["Items: 3"]},
        },
    )
    assert (await score(numbers)).reward == 1.0
    ten = _html_task(
        {
            "url": "__SHOPPING__/price",
            "locator": price,
            "required_contents": {"must_include": ["10"]},
        }
    )
    assert (await score(ten)).reward == 0.0


async def test_locator_that_throws_or_hangs_is_a_failed_check(
    page: Page, urls: dict[str, str], base: str
) -> None:
    await page.goto(f"{base}/wishlist")
    throws = _html_task(
        {
            "url": "last",
            "locator": "document.querySelector('.missing').outerText",
            "required_contents": {"must_include": ["x"]},
        }
    )
    result = await evaluate(throws, answer=None, page=page, urls=urls)
    assert result.reward == 0.0 and not result.unjudged
    assert result.checks[0].detail.startswith(
        "locator threw TypeError: Cannot read properties of null (reading 'outerText')"
    )
    assert f"on {base}/wishlist" in result.checks[0].detail
    never = _html_task(
        {
            "url": "last",
            "locator": "new Promise(() => {})",
            "required_contents": {"must_include": ["x"]},
        }
    )
    result = await evaluate(never, answer=None, page=page, urls=urls, locator_timeout_s=0.3)
    assert result.checks[0].passed is False
    assert result.checks[0].detail.startswith("locator timed out after 0.3 s")
    busy = _html_task(
        {
            "url": "last",
            "locator": "(() => { while (true) {} })()",
            "required_contents": {"must_include": ["x"]},
        }
    )
    result = await evaluate(busy, answer=None, page=page, urls=urls, locator_timeout_s=0.3)
    assert result.checks[0].detail.startswith("locator timed out")
    await page.close()  # a page stuck in a script loop still closes


async def test_browser_failures_raise_site_errors(page: Page, urls: dict[str, str]) -> None:
    unreachable = _html_task(
        {"url": "http://127.0.0.1:1/x", "locator": "", "required_contents": {"must_include": ["x"]}}
    )
    with pytest.raises(PageError, match=r"going to http://127.0.0.1:1/x: ") as info:
        await evaluate(unreachable, answer=None, page=page, urls=urls)
    assert not isinstance(info.value, PlaywrightError)
    assert isinstance(info.value.__cause__, PlaywrightError)
    await page.close()
    last = _html_task(
        {"url": "last", "locator": "document.title", "required_contents": {"must_include": ["x"]}}
    )
    with pytest.raises(PageClosedError):
        await evaluate(last, answer=None, page=page, urls=urls)
