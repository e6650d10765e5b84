"""Auto-login for self-hosted WebArena: Playwright storage states per site and site set.

WebArena tasks name a storage state (`./.auth/shopping_admin_state.json`,
`./.auth/gitlab.reddit_state.json`): the browser context starts logged in to those sites
with the standard accounts. `StorageStates` makes those files, keeps them valid and
hands their cookies to episodes:

- `ensure(instance, urls, sites, ...)` returns the state for a set of sites on one
  instance: the cached one while it was verified less than `check_interval_s` ago;
  else the file under `{auth_dir}/{instance}/` if it still logs in; else a fresh login
  through the sites' login forms (written atomically, mode 0600). One lock per
  (instance, sites): concurrent episodes wait for one login instead of racing.
- A state is valid when, in a fresh context holding only its cookies, each site's
  logged-in-only page (`check_path`) loads without a redirect (to the login page) and,
  when a `check_keyword` is set, its HTML holds the keyword. An expired state (session
  timed out, instance reset) fails the check and is refreshed by logging in again.
- `invalidate(instance)` forgets the verifications of an instance (after its reset).

Accounts are WebArena's standard ones (`STANDARD_ACCOUNTS`: the accounts, login pages,
form fields and check pages of WebArena's `browser_env/auto_login.py`), overridden field
by field by `sites.accounts` in the configuration. Form fields are locator specs:
`label:Email` (`label=:Email` matches exactly), `placeholder:user name`, `testid:id`,
`role:button:Sign In` or `css:#selector`.

Only cookies are applied to episodes (`EpisodeSetup.cookies`); a storage state's
localStorage (`origins`) is not (WebArena's sites keep their sessions in cookies), and
`StorageStates.statistics().origins_dropped` counts the states that had some.

Browser contexts come from the caller (`ContextFactory`): the runtime opens them from its
browser pool with the instance's URLs as the allowlist. Playwright errors are converted
to `AuthError` here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import structlog
from playwright.async_api import BrowserContext, Locator, Page
from playwright.async_api import Error as PlaywrightError

from runtime.base.config import WebArenaAccountConfig
from runtime.base.files import write_atomic
from sites.errors import AuthError
from sites.webarena import LOGIN_SITES, VARIABLE_OF_SITE, state_file_name

__all__ = [
    "STANDARD_ACCOUNTS",
    "Account",
    "AuthStatistics",
    "ContextFactory",
    "StorageStates",
    "accounts_from_config",
    "merge_cookies",
    "parse_locator",
]

log = structlog.get_logger("sites.auth")

Cookie = dict[str, Any]
# Opens a fresh browser context holding `cookies`, closed on exit.
ContextFactory = Callable[[Sequence[Cookie]], AbstractAsyncContextManager[BrowserContext]]

_LOCATOR_KINDS = ("label", "label=", "placeholder", "testid", "role", "css")


@dataclass(frozen=True, slots=True)
class Account:
    """How to log in to one site and how to tell that a context is logged in."""

    site: str
    username: str
    password: str
    login_path: str
    username_field: str
    password_field: str
    submit: str
    check_path: str
    check_keyword: str = ""

    def check_url(self, base_url: str) -> str:
        return _join(base_url, self.check_path.replace("{username}", self.username))


# WebArena's accounts and login forms (browser_env/env_config.py, auto_login.py).
STANDARD_ACCOUNTS: dict[str, Account] = {
    "shopping": Account(
        site="shopping",
        username="emma.lopez@gmail.com",
        password="Password.123",
        login_path="/customer/account/login/",
        username_field="label=:Email",
        password_field="label=:Password",
        submit="role:button:Sign In",
        check_path="/wishlist/",
    ),
    "shopping_admin": Account(
        site="shopping_admin",
        username="admin",
        password="admin1234",
        login_path="/",
        username_field="placeholder:user name",
        password_field="placeholder:password",
        submit="role:button:Sign in",
        check_path="/dashboard",
        check_keyword="Dashboard",
    ),
    "reddit": Account(
        site="reddit",
        username="MarvelsGrantMan136",
        password="test1234",
        login_path="/login",
        username_field="label:Username",
        password_field="label:Password",
        submit="role:button:Log in",
        check_path="/user/{username}/account",
        check_keyword="Delete",
    ),
    "gitlab": Account(
        site="gitlab",
        username="byteblaze",
        password="hello1234",
        login_path="/users/sign_in",
        username_field="testid:username-field",
        password_field="testid:password-field",
        submit="testid:sign-in-button",
        check_path="/-/profile",
    ),
}


def parse_locator(spec: str) -> tuple[str, tuple[str, ...]]:
    """`role:button:Sign In` -> ("role", ("button", "Sign In")); ValueError when malformed."""
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in _LOCATOR_KINDS or not rest:
        raise ValueError(
            f"locator {spec!r}: expected KIND:VALUE with KIND one of {', '.join(_LOCATOR_KINDS)}"
        )
    if kind == "role":
        role, sep, name = rest.partition(":")
        if not sep or not role or not name:
            raise ValueError(f"locator {spec!r}: expected role:ROLE:NAME")
        return kind, (role, name)
    return kind, (rest,)


def _locate(page: Page, spec: str) -> Locator:
    kind, args = parse_locator(spec)
    match kind:
        case "label":
            return page.get_by_label(args[0])
        case "label=":
            return page.get_by_label(args[0], exact=True)
        case "placeholder":
            return page.get_by_placeholder(args[0])
        case "testid":
            return page.get_by_test_id(args[0])
        case "role":
            return page.get_by_role(args[0], name=args[1])  # type: ignore[arg-type]
        case _:
            return page.locator(args[0])


def accounts_from_config(
    overrides: Mapping[str, WebArenaAccountConfig],
) -> dict[str, Account]:
    """The standard accounts with the configured fields (non-empty ones) on top.

    Raises AuthError naming `sites.accounts.<site>[.<field>]` for an unknown site or a
    malformed locator.
    """
    accounts = dict(STANDARD_ACCOUNTS)
    for site, config in overrides.items():
        if site not in accounts:
            raise AuthError(
                f"sites.accounts.{site}: unknown site (sites with accounts: "
                f"{', '.join(LOGIN_SITES)})"
            )
        changes = {
            name: value
            for name in WebArenaAccountConfig.__struct_fields__
            if (value := getattr(config, name))
        }
        if config.check_path and not config.check_keyword:
            changes["check_keyword"] = ""  # the standard keyword belongs to the standard page
        accounts[site] = replace(accounts[site], **changes)
    for site, account in accounts.items():
        for name in ("username_field", "password_field", "submit"):
            try:
                parse_locator(getattr(account, name))
            except ValueError as exc:
                raise AuthError(f"sites.accounts.{site}.{name}: {exc}") from exc
    return accounts


def merge_cookies(state: Sequence[Cookie], base: Sequence[Cookie]) -> list[Cookie]:
    """`state` then `base`; a base cookie replaces a state cookie of the same name, domain
    and path (the instance's own cookies win)."""

    def key(cookie: Cookie) -> tuple[str, str, str]:
        return (str(cookie.get("name")), str(cookie.get("domain")), str(cookie.get("path", "/")))

    replaced = {key(c) for c in base}
    return [dict(c) for c in state if key(c) not in replaced] + [dict(c) for c in base]


def _join(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + "/" + path.lstrip("/")


def _same_page(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.hostname, pa.port, pa.path.rstrip("/"), pa.query) == (
        pb.hostname,
        pb.port,
        pb.path.rstrip("/"),
        pb.query,
    )


@dataclass(slots=True)
class AuthStatistics:
    """What `StorageStates.statistics()` reports."""

    logins: int = 0
    checks: int = 0
    expired: int = 0
    failures: int = 0
    origins_dropped: int = 0
    states: dict[str, float] = field(default_factory=dict)  # key -> seconds since verified


@dataclass(slots=True)
class _Entry:
    cookies: list[Cookie]
    verified_at: float
    lock: anyio.Lock = field(default_factory=anyio.Lock)


class StorageStates:
    """Storage states per (instance, set of sites), made, checked and refreshed on demand."""

    def __init__(
        self,
        auth_dir: str | Path,
        accounts: Mapping[str, Account] | None = None,
        *,
        check_interval_s: float = 600.0,
        timeout_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.auth_dir = Path(auth_dir)
        self.accounts = dict(accounts if accounts is not None else STANDARD_ACCOUNTS)
        self.check_interval_s = check_interval_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._entries: dict[tuple[str, tuple[str, ...]], _Entry] = {}
        self._stats = AuthStatistics()

    def path(self, instance: str, sites: Sequence[str]) -> Path:
        """`{auth_dir}/{instance}/gitlab.reddit_state.json`."""
        return self.auth_dir / instance / state_file_name(sites)

    def invalidate(self, instance: str) -> None:
        """Check every state of `instance` again before its next use (after a reset)."""
        for (name, _), entry in self._entries.items():
            if name == instance:
                entry.verified_at = float("-inf")

    def statistics(self) -> AuthStatistics:
        now = self._clock()
        states = {
            f"{inst}/{state_file_name(sites)}": round(now - e.verified_at, 1)
            for (inst, sites), e in self._entries.items()
            if e.verified_at > float("-inf")
        }
        return replace(self._stats, states=states)

    async def ensure(
        self,
        instance: str,
        urls: Mapping[str, str],
        sites: Sequence[str],
        new_context: ContextFactory,
        *,
        base_cookies: Sequence[Cookie] = (),
    ) -> list[Cookie]:
        """The cookies of a valid storage state for `sites` on `instance` (see the module
        docstring); raises AuthError when logging in does not give a valid state."""
        combo = tuple(sorted(set(sites)))
        for site in combo:
            if site not in self.accounts:
                raise AuthError(f"no account for site {site!r} (known: {sorted(self.accounts)})")
            if VARIABLE_OF_SITE[site] not in urls:
                raise AuthError(
                    f"instance {instance!r}: no URL for {VARIABLE_OF_SITE[site]} "
                    f"(needed to log in to {site})"
                )
        key = (instance, combo)
        entry = self._entries.setdefault(key, _Entry(cookies=[], verified_at=float("-inf")))
        async with entry.lock:
            if self._clock() - entry.verified_at < self.check_interval_s:
                return merge_cookies(entry.cookies, base_cookies)
            path = self.path(instance, combo)
            try:
                with anyio.fail_after(self.timeout_s):
                    cookies = await self._valid_or_fresh(
                        instance,
                        urls=urls,
                        combo=combo,
                        path=path,
                        new_context=new_context,
                        base_cookies=base_cookies,
                    )
            except TimeoutError as exc:
                self._stats.failures += 1
                raise AuthError(
                    f"instance {instance!r}: logging in to {', '.join(combo)} took more than "
                    f"{self.timeout_s:g} s"
                ) from exc
            except AuthError:
                self._stats.failures += 1
                raise
            entry.cookies = cookies
            entry.verified_at = self._clock()
            return merge_cookies(cookies, base_cookies)

    async def _valid_or_fresh(
        self,
        instance: str,
        *,
        urls: Mapping[str, str],
        combo: tuple[str, ...],
        path: Path,
        new_context: ContextFactory,
        base_cookies: Sequence[Cookie],
    ) -> list[Cookie]:
        saved = await anyio.to_thread.run_sync(_read_state, path)
        if saved is not None:
            problem = await self._check(urls, combo, saved, new_context, base_cookies)
            if problem is None:
                log.info("auth.valid", instance=instance, sites=list(combo), path=str(path))
                return saved
            self._stats.expired += 1
            log.info("auth.expired", instance=instance, sites=list(combo), problem=problem)
        started = self._clock()
        state = await self._log_in(urls, combo, new_context, base_cookies)
        cookies = [c for c in state.get("cookies", []) if isinstance(c, dict)]
        problem = await self._check(urls, combo, cookies, new_context, base_cookies)
        if problem is not None:
            raise AuthError(f"instance {instance!r}: logged in, but {problem}")
        if any(o.get("localStorage") for o in state.get("origins", []) if isinstance(o, dict)):
            self._stats.origins_dropped += 1
        await anyio.to_thread.run_sync(_write_state, path, state)
        self._stats.logins += 1
        log.info(
            "auth.logged_in",
            instance=instance,
            sites=list(combo),
            path=str(path),
            seconds=round(self._clock() - started, 3),
        )
        return cookies

    async def _log_in(
        self,
        urls: Mapping[str, str],
        combo: tuple[str, ...],
        new_context: ContextFactory,
        base_cookies: Sequence[Cookie],
    ) -> dict[str, Any]:
        async with new_context(list(base_cookies)) as context:
            try:
                page = await context.new_page()
                for site in combo:
                    account = self.accounts[site]
                    base = urls[VARIABLE_OF_SITE[site]]
                    await page.goto(_join(base, account.login_path))
                    await _locate(page, account.username_field).fill(account.username)
                    await _locate(page, account.password_field).fill(account.password)
                    async with page.expect_navigation(timeout=self.timeout_s * 1000):
                        await _locate(page, account.submit).click()
                state = dict(await context.storage_state())
            except PlaywrightError as exc:
                raise AuthError(
                    f"logging in to {', '.join(combo)} failed: {str(exc).splitlines()[0]}"
                ) from exc
        return state

    async def _check(
        self,
        urls: Mapping[str, str],
        combo: tuple[str, ...],
        cookies: Sequence[Cookie],
        new_context: ContextFactory,
        base_cookies: Sequence[Cookie],
    ) -> str | None:
        """None when every site of `combo` is logged in; else what was wrong."""
        self._stats.checks += 1
        async with new_context(merge_cookies(cookies, base_cookies)) as context:
            try:
                page = await context.new_page()
                for site in combo:
                    account = self.accounts[site]
                    target = account.check_url(urls[VARIABLE_OF_SITE[site]])
                    await page.goto(target)
                    if not _same_page(page.url, target):
                        return f"{site}: {target} redirected to {page.url}"
                    if account.check_keyword and account.check_keyword not in await page.content():
                        return f"{site}: {target} does not show {account.check_keyword!r}"
            except PlaywrightError as exc:
                return f"checking failed: {str(exc).splitlines()[0]}"
        return None


def _read_state(path: Path) -> list[Cookie] | None:
    """The cookies of a saved state; None when there is none or it is unreadable."""
    try:
        raw = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("auth.unreadable_state", path=str(path), error=str(exc))
        return None
    cookies = raw.get("cookies") if isinstance(raw, dict) else None
    if not isinstance(cookies, list):
        return None
    return [c for c in cookies if isinstance(c, dict)]


def _write_state(path: Path, state: Mapping[str, Any]) -> None:
    """Write a storage state atomically (temp file, fsync, rename), readable by us only."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(state, indent=1, sort_keys=True).encode("utf-8")
        write_atomic(path, data, mode=0o600)
    except OSError as exc:
        raise AuthError(f"cannot write storage state {path}: {exc}") from exc
