"""`webagent sites serve` as a real subprocess driven by real Chromium, and
`webagent tasks generate|stats`."""

from __future__ import annotations

import json
import selectors
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import BrowserContext, Page

from runtime.base.messages import decode_tasks
from runtime.cli import main
from sites.builtin import ADMIN_HEADER as ADMIN
from sites.builtin import TENANT_COOKIE
from sites.builtin.admin import filter_orders
from sites.builtin.data import ACCOUNTS, build_world
from sites.builtin.maps import place_by_name, route
from sites.builtin.tenants import Tenant


@pytest.fixture(scope="module")
def served() -> Iterator[dict[str, str]]:
    """`webagent sites serve --seed 0` in a subprocess; its URLs from the first stdout line,
    the tenant API's header and token from the second."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runtime.cli",
            "--log-format",
            "json",
            "sites",
            "serve",
            "--seed",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(timeout=60), "no URLs printed within 60 s"
        urls = _Served(json.loads(proc.stdout.readline()))
        tenant_api = json.loads(proc.stdout.readline())["tenant_api"]
        urls.admin = {tenant_api["header"]: tenant_api["token"]}
        yield urls
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert '"sites.stopped"' in stderr


class _Served(dict[str, str]):
    """The URLs by site name, and the headers the tenant API needs."""

    admin: dict[str, str]


async def _page(context: BrowserContext, urls: dict[str, str], env: str) -> Page:
    assert isinstance(urls, _Served)
    async with httpx.AsyncClient(headers=urls.admin) as client:
        anonymous = await client.post(
            f"{urls[env]}/__webagent/tenants", json={"logged_in": []}, headers={ADMIN: ""}
        )
        assert anonymous.status_code == 403  # without the printed token: refused
        made = await client.post(f"{urls[env]}/__webagent/tenants", json={"logged_in": []})
    tenant = made.json()["tenant"]
    await context.add_cookies([{"name": TENANT_COOKIE, "value": tenant, "url": urls[env]}])
    page = await context.new_page()
    await page.goto(urls[env])
    return page


async def _log_in(page: Page, site: str) -> None:
    account = ACCOUNTS[site]
    await page.get_by_role("link", name="Sign In").click()
    await page.locator("input[name=username]").fill(account.username)
    await page.locator("input[name=password]").fill(account.password)
    await page.get_by_role("button", name="Log In").click()
    await page.locator("#signed-in").wait_for()
    assert account.username in await page.locator("#signed-in").inner_text()


pytestmark = [pytest.mark.anyio, pytest.mark.browser]


async def test_shop_login_search_add_to_cart(
    served: dict[str, str], context: BrowserContext
) -> None:
    page = await _page(context, served, "SHOPPING")
    await _log_in(page, "shopping")
    await page.locator("input[name=q]").fill("kettle")
    await page.locator("input[name=q]").press("Enter")
    first = page.locator("#products a").first
    name = await first.inner_text()
    await first.click()
    await page.locator("input[name=qty]").fill("2")
    await page.get_by_role("button", name="Add to Cart").click()
    await page.get_by_text(f"You added {name} to your shopping cart.").wait_for()
    await page.get_by_role("link", name="My Cart").click()
    assert await page.locator("#cart-items .name").inner_text() == name
    assert await page.locator("#cart-items .qty").inner_text() == "2"


async def test_admin_login_filter_orders(served: dict[str, str], context: BrowserContext) -> None:
    page = await _page(context, served, "SHOPPING_ADMIN")
    assert "/login" in page.url  # every admin page needs the login
    await page.locator("input[name=username]").fill("admin")
    await page.locator("input[name=password]").fill(ACCOUNTS["shopping_admin"].password)
    await page.get_by_role("button", name="Log In").click()
    await page.get_by_role("link", name="Orders").click()
    await page.locator("select[name=status]").select_option(label="Pending")
    await page.get_by_role("button", name="Apply Filters").click()
    expected = len(filter_orders(Tenant("x"), build_world(0), status="Pending"))
    assert await page.locator("#record-count").inner_text() == f"{expected} records found"


async def test_forum_login_submit_post_logout(
    served: dict[str, str], context: BrowserContext
) -> None:
    page = await _page(context, served, "REDDIT")
    await _log_in(page, "reddit")
    await page.get_by_role("link", name="Submit").click()
    await page.locator("select[name=forum]").select_option(label="books")
    await page.locator("input[name=title]").fill("A post from the CLI test")
    await page.locator("textarea[name=body]").fill("Hello from Chromium.")
    await page.get_by_role("button", name="Create Submission").click()
    assert await page.locator("#post-title").inner_text() == "A post from the CLI test"
    assert "/f/books/" in page.url
    await page.get_by_role("button", name="Sign Out").click()
    await page.get_by_role("link", name="Sign In").wait_for()


async def test_code_login_create_and_close_issue(
    served: dict[str, str], context: BrowserContext
) -> None:
    page = await _page(context, served, "GITLAB")
    await _log_in(page, "gitlab")
    await page.get_by_role("link", name="byteblaze/dotfiles").click()
    await page.get_by_role("link", name="Issues", exact=True).click()
    await page.get_by_role("link", name="New issue").click()
    await page.locator("input[name=title]").fill("Issue from the CLI test")
    await page.get_by_role("button", name="Create issue").click()
    assert await page.locator("#issue-title").inner_text() == "Issue from the CLI test"
    assert await page.locator("#issue-state").inner_text() == "Open"
    await page.get_by_role("button", name="Close issue").click()
    await page.get_by_role("button", name="Reopen issue").wait_for()
    assert await page.locator("#issue-state").inner_text() == "Closed"


async def test_map_directions(served: dict[str, str], context: BrowserContext) -> None:
    world = build_world(0)
    base = Tenant("x")
    a, b = list(world.places.rows.values())[:2]
    page = await _page(context, served, "MAP")
    await page.get_by_role("link", name="Directions").click()
    await page.locator("input[name=from]").fill(a.name)
    await page.locator("input[name=to]").fill(b.name.upper())  # names match in any case
    await page.locator("select[name=mode]").select_option(label="Bicycle")
    await page.get_by_role("button", name="Go").click()
    found_a, found_b = place_by_name(base, world, a.name), place_by_name(base, world, b.name)
    assert found_a is not None and found_b is not None
    km = route(found_a, found_b, "Bicycle")[0]
    assert await page.locator("#distance").inner_text() == f"{km:.1f} km"


def test_tasks_generate_and_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", "generate", "--out", str(tmp_path), "--seed", "0"]) == 0
    sizes = {}
    for split in ("train", "test", "ood"):
        sizes[split] = len(decode_tasks((tmp_path / f"{split}.json").read_bytes()))
    assert sizes["train"] >= 1000 and sizes["test"] >= 165 and sizes["ood"] >= 100
    capsys.readouterr()
    assert main(["tasks", "stats", "--dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    total = next(line for line in table.splitlines() if line.startswith("total"))
    assert total.split()[1:] == [str(sizes["train"]), str(sizes["test"]), str(sizes["ood"])]
    for site in ("shopping", "shopping_admin", "reddit", "gitlab", "map"):
        assert f"site:{site} " in table
    assert "steps:1-3" in table and "steps:10+" in table
    assert main(["tasks", "stats", "--dir", str(tmp_path / "missing")]) == 2
