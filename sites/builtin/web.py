"""What the five site apps share: tenant resolution, rendering, forms, login, pagination.

Every page handler is an `async def handler(req: Req) -> Response` wrapped by `Site.page`,
which finds the tenant named by the `webagent_tenant` cookie before the handler runs:
no cookie -> 403 page, an unknown tenant -> 404 page, both saying what is wrong. A
handler never sees another tenant's state.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import parse_qsl, urlencode

import jinja2
import msgspec
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from sites.builtin.data import ACCOUNTS, World
from sites.builtin.records import money
from sites.builtin.tenants import Tenant, TenantStore

__all__ = [
    "TENANT_COOKIE",
    "Counters",
    "Page",
    "Redirect",
    "Req",
    "Site",
    "paginate",
]

TENANT_COOKIE = "webagent_tenant"

T = TypeVar("T")

_TEMPLATES = Path(__file__).parent / "templates"
_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(_TEMPLATES),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.globals["money"] = money


class Counters(msgspec.Struct, kw_only=True):
    """Request counters shared by the five apps (`BuiltinSites.statistics`)."""

    requests: int = 0
    tenant_missing: int = 0
    tenant_unknown: int = 0


class Redirect(Exception):
    """Raised by a handler to answer with a 303 redirect to `url`."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url


class Page(Generic[T]):
    """One page of a list, with the URLs of the Previous and Next links."""

    def __init__(self, items: Sequence[T], number: int, per_page: int, request: Request) -> None:
        self.total = len(items)
        self.pages = max(1, math.ceil(self.total / per_page))
        self.number = min(max(1, number), self.pages)
        start = (self.number - 1) * per_page
        self.items = list(items[start : start + per_page])
        self.first_index = start + 1
        self.prev_url = _with_query(request, page=self.number - 1) if self.number > 1 else ""
        self.next_url = (
            _with_query(request, page=self.number + 1) if self.number < self.pages else ""
        )


def paginate(items: Sequence[T], req: Req, per_page: int) -> Page[T]:
    """The page of `items` named by the `page` query parameter (1 when absent or bad)."""
    return Page(items, req.int_arg("page", 1), per_page, req.request)


def _with_query(request: Request, **changes: Any) -> str:
    params = dict(request.query_params)
    params.update({key: str(value) for key, value in changes.items()})
    return f"{request.url.path}?{urlencode(params)}"


class Req:
    """A request as a handler sees it: its tenant, the site's login, forms and rendering."""

    def __init__(self, site: Site, request: Request, tenant: Tenant) -> None:
        self.site = site
        self.request = request
        self.tenant = tenant
        self.world = site.world

    @property
    def user(self) -> str | None:
        """The account logged in to this site in this tenant, if any."""
        return self.tenant.sessions.get(self.site.name)

    def require_login(self) -> str:
        """The logged-in account; otherwise redirect to the login page and come back."""
        user = self.user
        if user is None:
            target = self.request.url.path
            if self.request.method == "GET" and self.request.url.query:
                target += f"?{self.request.url.query}"
            raise Redirect(f"/login?{urlencode({'next': target})}")
        return user

    def arg(self, name: str, default: str = "") -> str:
        return self.request.query_params.get(name, default).strip()

    def int_arg(self, name: str, default: int) -> int:
        try:
            return int(self.request.query_params.get(name, ""))
        except ValueError:
            return default

    def path_int(self, name: str) -> int:
        value: int = self.request.path_params[name]
        return value

    async def form(self) -> dict[str, str]:
        """The URL-encoded form body (the sites' forms use no other encoding)."""
        body = (await self.request.body()).decode("utf-8", errors="replace")
        return {key: value.strip() for key, value in parse_qsl(body, keep_blank_values=True)}

    def flash(self, message: str) -> None:
        """A message shown once, on the next page this tenant opens on this site."""
        self.tenant.flashes[self.site.name] = message

    def render(self, template: str, *, status: int = 200, **context: Any) -> HTMLResponse:
        html = _ENV.get_template(template).render(
            site=self.site,
            user=self.user,
            flash=self.tenant.flashes.pop(self.site.name, ""),
            **context,
        )
        return HTMLResponse(html, status_code=status)

    def not_found(self, what: str) -> HTMLResponse:
        return self.render("error.html", status=404, title="Not found", message=what)


Handler = Callable[[Req], Awaitable[Response]]


class Site:
    """One site's app: its pages plus the login, logout and tenant routes every site has."""

    def __init__(
        self,
        *,
        name: str,
        title: str,
        nav: Sequence[tuple[str, str]],
        world: World,
        tenants: TenantStore,
        counters: Counters,
        login_label: str = "Username",
    ) -> None:
        self.name = name
        self.title = title
        self.nav = list(nav)
        self.world = world
        self.tenants = tenants
        self.counters = counters
        self.login_label = login_label
        self.has_login = name in ACCOUNTS
        self.routes: list[Route] = []
        if self.has_login:
            self.add("/login", self._login_page)
            self.add("/login", self._login_submit, methods=["POST"])
            self.add("/logout", self._logout, methods=["POST"])

    def add(self, path: str, handler: Handler, *, methods: Sequence[str] = ("GET",)) -> None:
        """Register a page handler behind the tenant check."""
        self.routes.append(Route(path, self.page(handler), methods=list(methods)))

    def page(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            self.counters.requests += 1
            tenant_id = request.cookies.get(TENANT_COOKIE, "")
            if not tenant_id:
                self.counters.tenant_missing += 1
                return _error_page(
                    403,
                    "No tenant",
                    f"This site serves each episode its own state: the request carried no "
                    f"'{TENANT_COOKIE}' cookie. Create a tenant first "
                    f"(POST /__webagent/tenants) and set the cookie.",
                )
            tenant = self.tenants.lookup(tenant_id)
            if tenant is None:
                self.counters.tenant_unknown += 1
                return _error_page(
                    404,
                    "Unknown tenant",
                    f"The '{TENANT_COOKIE}' cookie names a tenant that does not exist "
                    f"(never created, dropped, or evicted): {tenant_id[:64]!r}.",
                )
            try:
                return await handler(Req(self, request, tenant))
            except Redirect as redirect:
                return RedirectResponse(redirect.url, status_code=303)

        return endpoint

    # ------------------------------------------------------------------ login

    async def _login_page(self, req: Req) -> Response:
        return req.render("login.html", next=req.arg("next", "/"), error="", label=self.login_label)

    async def _login_submit(self, req: Req) -> Response:
        form = await req.form()
        account = ACCOUNTS[self.name]
        target = form.get("next", "/")
        if not target.startswith("/") or target.startswith("//"):
            target = "/"
        if (
            form.get("username", "") == account.username
            and form.get("password", "") == account.password
        ):
            req.tenant.sessions[self.name] = account.username
            raise Redirect(target)
        return req.render(
            "login.html",
            status=401,
            next=target,
            error="The account sign-in was incorrect. Please check the username and password.",
            label=self.login_label,
        )

    async def _logout(self, req: Req) -> Response:
        req.tenant.sessions.pop(self.name, None)
        req.flash("You are signed out.")
        raise Redirect("/")


def _error_page(status: int, title: str, message: str) -> HTMLResponse:
    html = _ENV.get_template("tenant_error.html").render(title=title, message=message)
    return HTMLResponse(html, status_code=status)
