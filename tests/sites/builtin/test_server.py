"""Serving: the tenant API, error pages, login sessions, isolation, ports, shutdown."""

from __future__ import annotations

import socket

import anyio
import httpx
import msgspec
import pytest
from playwright.async_api import Browser

from runtime.base.config import SitesConfig
from runtime.base.messages import TaskConfig
from sites.builtin import (
    ADMIN_HEADER,
    SITE_NAMES,
    TENANT_COOKIE,
    BuiltinSites,
    plan_for,
    serve_builtin_sites,
)
from sites.builtin.errors import ServeError, TenantError
from sites.builtin.suite import templates
from sites.tasks import substitute_task

pytestmark = pytest.mark.anyio


def _client(tenant: str | None = None) -> httpx.AsyncClient:
    cookies = {TENANT_COOKIE: tenant} if tenant else None
    return httpx.AsyncClient(cookies=cookies, timeout=10)


async def test_urls_name_five_listening_ports(builtin_sites: BuiltinSites) -> None:
    assert set(builtin_sites.urls) == set(SITE_NAMES)
    ports = {url.rsplit(":", 1)[1] for url in builtin_sites.urls.values()}
    assert len(ports) == 5
    async with _client() as client:
        for env, url in builtin_sites.urls.items():
            health = (await client.get(f"{url}/__webagent/health")).json()
            assert health["site"] == env


async def test_tenant_api_over_http(builtin_sites: BuiltinSites) -> None:
    shop = builtin_sites.urls["SHOPPING"]
    async with _client() as client:
        client.headers[ADMIN_HEADER] = builtin_sites.admin_token
        made = await client.post(f"{shop}/__webagent/tenants", json={"logged_in": ["shopping"]})
        assert made.status_code == 201
        tenant = made.json()["tenant"]
        bad = await client.post(f"{shop}/__webagent/tenants", json={"logged_in": ["bank"]})
        assert bad.status_code == 400 and "bank" in bad.json()["error"]
        junk = await client.post(f"{shop}/__webagent/tenants", content=b"{not json")
        assert junk.status_code == 400
    async with _client(tenant) as client:
        account = await client.get(f"{shop}/account")
        assert account.status_code == 200 and "Emma Lopez" in account.text
        # The same cookie works on every site (cookies are per host, not per port).
        forum = await client.get(f"{builtin_sites.urls['REDDIT']}/forums")
        assert forum.status_code == 200 and "Sign In" in forum.text  # not logged in there
        client.headers[ADMIN_HEADER] = builtin_sites.admin_token
        admin = await client.delete(f"{builtin_sites.urls['MAP']}/__webagent/tenants/{tenant}")
        assert admin.status_code == 204
        gone = await client.get(f"{shop}/account")
        assert gone.status_code == 404 and "Unknown tenant" in gone.text
        again = await client.delete(f"{shop}/__webagent/tenants/{tenant}")
        assert again.status_code == 404


async def test_missing_or_unknown_tenant_gets_an_error_page(builtin_sites: BuiltinSites) -> None:
    before = builtin_sites.statistics()
    async with _client() as client:
        for url in builtin_sites.urls.values():
            missing = await client.get(f"{url}/")
            assert missing.status_code == 403
            assert "No tenant" in missing.text and TENANT_COOKIE in missing.text
    async with _client("0123456789abcdef") as client:
        unknown = await client.get(f"{builtin_sites.urls['GITLAB']}/explore")
        assert unknown.status_code == 404
        assert "Unknown tenant" in unknown.text and "0123456789abcdef" in unknown.text
        assert "byteblaze" not in unknown.text  # no site data at all
    after = builtin_sites.statistics()
    assert after["requests_without_tenant"] == before["requests_without_tenant"] + 5
    assert after["requests_unknown_tenant"] == before["requests_unknown_tenant"] + 1


async def test_logout_touches_only_its_own_tenant(builtin_sites: BuiltinSites) -> None:
    forum = builtin_sites.urls["REDDIT"]
    one = builtin_sites.create_tenant(logged_in=["reddit"])
    two = builtin_sites.create_tenant(logged_in=["reddit"])
    async with _client(one) as client:
        assert "Signed in as MarvelsGrandpa17" in (await client.get(f"{forum}/")).text
        await client.post(f"{forum}/logout")
        page = await client.get(f"{forum}/submit")
        assert page.status_code == 303 and page.headers["location"].startswith("/login")
    async with _client(two) as client:
        assert (await client.get(f"{forum}/submit")).status_code == 200
    with pytest.raises(TenantError, match="bank"):
        builtin_sites.create_tenant(logged_in=["bank"])


async def test_wrong_password_is_refused(builtin_sites: BuiltinSites) -> None:
    tenant = builtin_sites.create_tenant()
    code = builtin_sites.urls["GITLAB"]
    async with _client(tenant) as client:
        wrong = await client.post(
            f"{code}/login", data={"username": "byteblaze", "password": "nope", "next": "/"}
        )
        assert wrong.status_code == 401 and "incorrect" in wrong.text
        right = await client.post(
            f"{code}/login", data={"username": "byteblaze", "password": "hello1234", "next": "//x"}
        )
        assert right.status_code == 303 and right.headers["location"] == "/"  # no open redirect


def _variant(task: TaskConfig, **changes: str) -> TaskConfig:
    """The same task with other instantiation values (rebuilt by its template)."""
    template = templates()[int(task.intent_template_id)]  # type: ignore[arg-type]
    params = {**task.instantiation_dict, **changes}  # type: ignore[dict-item]
    from sites.builtin.data import build_world
    from sites.builtin.tenants import Tenant

    built = template.build(build_world(0), Tenant("x"), params)
    return msgspec.structs.replace(
        task, intent=built.intent, instantiation_dict=params, eval=built.eval
    )


@pytest.mark.browser
async def test_concurrent_tenants_see_only_their_own_writes(
    builtin_sites: BuiltinSites,
    suite: dict[str, list[TaskConfig]],
    browser: Browser,
    plan_runner,  # type: ignore[no-untyped-def]
) -> None:
    """Two episodes reply to the same post at once; each sees its own comment only, the
    post's comment count grows by one in each, a fresh tenant sees neither comment."""
    reply = next(t for t in suite["test"] if t.intent_template_id == 308)
    tasks = [_variant(reply, comment=f"Episode {i} was here.") for i in (1, 2)]
    contexts = [await browser.new_context() for _ in tasks]
    pages = []
    try:
        async with anyio.create_task_group() as tg:
            for context, task in zip(contexts, tasks, strict=True):

                async def run(context=context, task=task) -> None:  # type: ignore[no-untyped-def]
                    page, _ = await plan_runner.start(context, task)
                    await plan_runner.run(page, plan_for(task), where=task.intent)
                    pages.append((page, task))

                tg.start_soon(run)
        post_url = substitute_task(reply, builtin_sites.urls).eval.program_html[0].url  # type: ignore[index]
        counts = []
        for page, task in pages:
            await page.goto(post_url)
            comments = await page.locator("#comments").inner_text()
            mine = task.instantiation_dict["comment"]  # type: ignore[index]
            assert mine in comments
            assert sum(f"Episode {i} was here." in comments for i in (1, 2)) == 1
            counts.append(await page.locator("#comment-count").inner_text())
        fresh = builtin_sites.create_tenant()
        async with _client(fresh) as client:
            text = (await client.get(post_url)).text
        assert "was here." not in text
        base = int(text.split('id="comment-count">')[1].split("<")[0])
        assert counts == [str(base + 1)] * 2
        async with _client("not-a-tenant") as client:
            stranger = await client.get(post_url)
        assert stranger.status_code == 404 and "Unknown tenant" in stranger.text
        assert "was here." not in stranger.text
    finally:
        for context in contexts:
            await context.close()


async def test_eviction_past_max_tenants() -> None:
    sites = BuiltinSites(SitesConfig(max_tenants=2))
    first = sites.create_tenant()
    sites.create_tenant()
    sites.create_tenant()
    stats = sites.statistics()
    assert first not in sites.tenants
    assert (stats["tenants_alive"], stats["tenants_evicted"]) == (2, 1)


async def test_busy_port_is_a_clear_error_and_servers_stop_on_exit() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ServeError, match=f"127.0.0.1:{port}"):
            async with serve_builtin_sites(SitesConfig(port=port)):
                pass  # pragma: no cover
    async with serve_builtin_sites(SitesConfig()) as sites:
        url = sites.urls["MAP"]
        async with _client() as client:
            assert (await client.get(f"{url}/__webagent/health")).status_code == 200
    async with _client() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"{url}/__webagent/health")


async def test_the_tenant_api_answers_only_the_owner_of_the_sites() -> None:
    """4,200 anonymous POSTs once evicted an in-flight episode's tenant (LRU)."""
    async with serve_builtin_sites(SitesConfig(max_tenants=8)) as sites:
        shop = sites.urls["SHOPPING"]
        tenant = sites.create_tenant(logged_in=["shopping"])  # the runtime's in-process way
        created = sites.tenants.created
        async with _client() as client:
            for header in ({}, {ADMIN_HEADER: ""}, {ADMIN_HEADER: sites.admin_token + "x"}):
                for _ in range(20):
                    made = await client.post(f"{shop}/__webagent/tenants", json={}, headers=header)
                    assert made.status_code == 403
                    assert ADMIN_HEADER in made.json()["error"]
            dropped = await client.delete(f"{shop}/__webagent/tenants/{tenant}")
            assert dropped.status_code == 403
            # No person's session page either unless asked for.
            assert (await client.post(f"{shop}/__webagent/session")).status_code in (404, 405)
        assert sites.tenants.created == created
        async with _client(tenant) as client:
            assert (await client.get(f"{shop}/account")).status_code == 200
    other = BuiltinSites(SitesConfig())
    assert other.admin_token != sites.admin_token and len(sites.admin_token) >= 32


async def test_person_sessions_are_served_when_asked_for() -> None:
    async with serve_builtin_sites(SitesConfig(), person_sessions=True) as sites:
        shop = sites.urls["SHOPPING"]
        async with httpx.AsyncClient(timeout=10) as client:
            assert (await client.get(f"{shop}/__webagent/")).status_code == 200
            started = await client.post(f"{shop}/__webagent/session")
            assert started.status_code == 303 and TENANT_COOKIE in started.headers["set-cookie"]
