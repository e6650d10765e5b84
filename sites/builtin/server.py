"""The five built-in sites as one object, served by in-process uvicorn servers.

`BuiltinSites` holds the seeded world, the tenants and one Starlette app per site.
`serve_builtin_sites(config)` binds one port per site on `config.host` (port 0: any free
port; otherwise `config.port + i` in SITE_NAMES order), runs the uvicorn servers in a task
group it owns and yields once every server is listening; leaving it stops them.

Besides its pages, every site port answers the tenant API (no tenant cookie needed), for
when the sites run in another process (`webagent sites serve`). Creating and dropping
tenants needs the header `ADMIN_HEADER: <BuiltinSites.admin_token>`, a random secret made
when the sites start (403 without it): a page the agent visits, or anyone else who can
reach the port, cannot evict the tenants of episodes in flight. The runtime in the same
process calls `create_tenant` directly; `webagent sites serve` prints the secret.

    POST   /__webagent/tenants        {"logged_in": ["shopping", ...]} -> 201 {"tenant": "..."}
    DELETE /__webagent/tenants/{id}   -> 204, or 404 when unknown
    GET    /__webagent/health         -> {"site": "SHOPPING", "tenants": 3}
    GET    /__webagent/               a page with a button that starts a browser session;
                                      only with `person_sessions=True`
                                      (`webagent sites serve --person-sessions`)
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
from collections.abc import AsyncIterator, Callable, Iterable

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from runtime.base.config import SitesConfig
from runtime.base.http import serve_asgi
from sites.builtin.admin import build_admin
from sites.builtin.code import build_code
from sites.builtin.data import ACCOUNTS, World, build_world
from sites.builtin.errors import ServeError, TenantError
from sites.builtin.forum import build_forum
from sites.builtin.maps import build_map
from sites.builtin.shop import build_shop
from sites.builtin.tenants import Tenant, TenantStore
from sites.builtin.web import TENANT_COOKIE, Counters, Site

__all__ = ["ADMIN_HEADER", "SITE_NAMES", "BuiltinSites", "serve_builtin_sites"]

# The header that carries `BuiltinSites.admin_token` to the tenant API.
ADMIN_HEADER = "X-Webagent-Admin"

# WebArena environment name -> the task `sites` name.
SITE_NAMES: dict[str, str] = {
    "SHOPPING": "shopping",
    "SHOPPING_ADMIN": "shopping_admin",
    "REDDIT": "reddit",
    "GITLAB": "gitlab",
    "MAP": "map",
}

_BUILDERS: dict[str, Callable[[World, TenantStore, Counters], Site]] = {
    "SHOPPING": build_shop,
    "SHOPPING_ADMIN": build_admin,
    "REDDIT": build_forum,
    "GITLAB": build_code,
    "MAP": build_map,
}


class _NewTenant(msgspec.Struct, forbid_unknown_fields=True):
    logged_in: list[str] = []


class BuiltinSites:
    """The whole embedded environment: data, tenants and the five apps.

    `urls` is filled by `serve_builtin_sites` once the servers listen:
    {"SHOPPING": "http://127.0.0.1:PORT", ...}, five entries under WebArena's names.
    """

    def __init__(
        self, config: SitesConfig, *, admin_token: str = "", person_sessions: bool = False
    ) -> None:
        self.config = config
        # The tenant API's secret (a fresh random one unless given).
        self.admin_token = admin_token or secrets.token_urlsafe(32)
        self.person_sessions = person_sessions
        self.world = build_world(config.seed)
        self.tenants = TenantStore(config.max_tenants)
        self.counters = Counters()
        self.urls: dict[str, str] = {}
        self.sites: dict[str, Site] = {
            env: build(self.world, self.tenants, self.counters) for env, build in _BUILDERS.items()
        }
        self.apps: dict[str, Starlette] = {
            env: Starlette(routes=[*self._tenant_routes(env), *site.routes])
            for env, site in self.sites.items()
        }

    def create_tenant(self, *, logged_in: Iterable[str] = ()) -> str:
        """A fresh tenant (the seeded data, no copy) with the default account of each
        named site ("shopping", "shopping_admin", "reddit", "gitlab"; "map" has no
        accounts and is accepted) logged in. Returns the value for the tenant cookie."""
        names = list(logged_in)
        unknown = sorted(set(names) - set(SITE_NAMES.values()))
        if unknown:
            raise TenantError(
                f"cannot log in to unknown site(s) {unknown}; known: {sorted(SITE_NAMES.values())}"
            )
        tenant = self.tenants.create()
        _log_in(tenant, names)
        return tenant.id

    def drop_tenant(self, tenant: str) -> None:
        """Forget a tenant and free its state (no error if it is already gone)."""
        self.tenants.drop(tenant)

    def statistics(self) -> dict[str, int]:
        return {
            "tenants_alive": len(self.tenants),
            "tenants_created": self.tenants.created,
            "tenants_dropped": self.tenants.dropped,
            "tenants_evicted": self.tenants.evicted,
            "tenant_rows_written": self.tenants.written_rows(),
            "requests": self.counters.requests,
            "requests_without_tenant": self.counters.tenant_missing,
            "requests_unknown_tenant": self.counters.tenant_unknown,
        }

    # ------------------------------------------------------------------ tenant API

    def _admin(self, request: Request) -> Response | None:
        """None when the request carries the admin token; else the 403 to answer."""
        given = request.headers.get(ADMIN_HEADER, "").encode()
        if hmac.compare_digest(given, self.admin_token.encode()):
            return None
        return JSONResponse(
            {
                "error": f"the tenant API needs the {ADMIN_HEADER} header with the token "
                "that `webagent sites serve` printed"
            },
            status_code=403,
        )

    def _tenant_routes(self, env: str) -> list[Route]:
        async def create(request: Request) -> Response:
            if (refused := self._admin(request)) is not None:
                return refused
            body = await request.body()
            try:
                spec = msgspec.json.decode(body or b"{}", type=_NewTenant)
                tenant = self.create_tenant(logged_in=spec.logged_in)
            except (msgspec.DecodeError, msgspec.ValidationError, TenantError) as exc:
                return JSONResponse({"error": f"bad tenant request: {exc}"}, status_code=400)
            return JSONResponse({"tenant": tenant}, status_code=201)

        async def drop(request: Request) -> Response:
            if (refused := self._admin(request)) is not None:
                return refused
            tenant_id = request.path_params["tenant"]
            if not self.tenants.drop(tenant_id):
                return JSONResponse({"error": f"no tenant {tenant_id!r}"}, status_code=404)
            return Response(status_code=204)

        async def health(request: Request) -> Response:
            return JSONResponse({"site": env, "tenants": len(self.tenants)})

        async def start_page(request: Request) -> Response:
            return HTMLResponse(
                "<!doctype html><title>Built-in sites</title><h1>Built-in sites</h1>"
                "<p>Every visitor needs a tenant: its own copy of the sites' state.</p>"
                '<form method="post" action="/__webagent/session">'
                "<button>Start a session</button></form>"
            )

        async def start_session(request: Request) -> Response:
            tenant = self.create_tenant(logged_in=ACCOUNTS)
            response = RedirectResponse("/", status_code=303)
            response.set_cookie(TENANT_COOKIE, tenant, path="/", httponly=True)
            return response

        routes = [
            Route("/__webagent/tenants", create, methods=["POST"]),
            Route("/__webagent/tenants/{tenant}", drop, methods=["DELETE"]),
            Route("/__webagent/health", health, methods=["GET"]),
        ]
        if self.person_sessions:  # anyone who reaches the port may make tenants then
            routes += [
                Route("/__webagent/", start_page, methods=["GET"]),
                Route("/__webagent/session", start_session, methods=["POST"]),
            ]
        return routes


def _log_in(tenant: Tenant, names: Iterable[str]) -> None:
    for name in names:
        account = ACCOUNTS.get(name)
        if account is not None:
            tenant.sessions[name] = account.username


@contextlib.asynccontextmanager
async def serve_builtin_sites(
    config: SitesConfig, *, person_sessions: bool = False
) -> AsyncIterator[BuiltinSites]:
    """Serve the five sites in-process; yields once every server listens, stops on exit.

    `person_sessions` adds the start page that gives a person in a browser a tenant.
    """
    sites = BuiltinSites(config, person_sessions=person_sessions)
    async with contextlib.AsyncExitStack() as stack:
        for offset, env in enumerate(SITE_NAMES):
            port = config.port + offset if config.port else 0
            try:
                sites.urls[env] = await stack.enter_async_context(
                    serve_asgi(
                        sites.apps[env],
                        host=config.host,
                        port=port,
                        graceful_s=config.shutdown_timeout_s,
                        startup_s=config.startup_timeout_s,
                        limits=None,  # only our own browsers come here: uvicorn's fast protocol
                        name=f"site {env}",
                    )
                )
            except OSError as exc:
                raise ServeError(
                    f"cannot listen on {config.host}:{port}: {exc.strerror or exc}"
                ) from exc
        yield sites
