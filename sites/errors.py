"""Errors of the sites package.

    Exception
    └── SiteError                  base of everything `sites` raises on purpose
        ├── TaskFileError          a task file that cannot be used: names file, task, field
        ├── PlaceholderError       a `__SITE__` placeholder with no URL to put in its place
        ├── PageError              the browser failed under an evaluator (Playwright, converted)
        │   └── PageClosedError    the page or its browser is gone
        ├── ChatError              a chat model failed or answered unreadably (httpx)
        │   ├── JudgeError         the fuzzy-match judge's
        │   └── GeneratorError     WebRL's task generator's
        └── WebArenaError          self-hosted WebArena (`sites.webarena`, `.auth`, `.pool`)
            ├── SiteURLError       a site URL that is missing or not an http(s) URL
            ├── AuthError          auto-login failed or a storage state is unusable
            ├── ResetError         an instance reset failed or timed out (httpx, subprocess)
            └── NoInstanceError    no instance is left in the pool

Playwright and httpx errors are converted at one boundary each (`sites.evaluators`,
`sites.chat`, `sites.auth` and `sites.pool`) with `raise ... from exc`; none of theirs
leaks out of this package.
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "ChatError",
    "GeneratorError",
    "JudgeError",
    "NoInstanceError",
    "PageClosedError",
    "PageError",
    "PlaceholderError",
    "ResetError",
    "SiteError",
    "SiteURLError",
    "TaskFileError",
    "WebArenaError",
]


class SiteError(Exception):
    """Base of the errors `sites` raises on purpose."""


class TaskFileError(SiteError):
    """A task file (or one task of it) that cannot be used.

    `task` is "task 12" when the task id is readable, else "item 3" (its index in the
    file); `field` is the path inside the task, e.g. `eval.reference_answers.must_include`.
    """

    def __init__(self, source: str, task: str, field: str, problem: str) -> None:
        self.source = source
        self.task = task
        self.field = field
        self.problem = problem
        where = ": ".join(part for part in (source, task, field) if part)
        super().__init__(f"{where}: {problem}")


class PlaceholderError(SiteError):
    """A URL kept a `__NAME__` placeholder that the given site URLs do not resolve."""

    def __init__(self, placeholder: str, text: str, known: list[str]) -> None:
        self.placeholder = placeholder
        self.text = text
        names = ", ".join(known) if known else "none"
        super().__init__(f"no URL for placeholder {placeholder} in {text!r} (site URLs: {names})")


class PageError(SiteError):
    """The browser failed while an evaluator used it (navigation, script, page state)."""


class PageClosedError(PageError):
    """The page, its context or its browser was closed or crashed."""


class ChatError(SiteError):
    """A chat model (`sites.chat.ChatModel`) could not be asked or gave no readable reply."""


class JudgeError(ChatError):
    """The fuzzy-match judge could not be asked or gave no readable verdict."""


class GeneratorError(ChatError):
    """WebRL's task generator could not be asked (its unusable lines are dropped, not this)."""


class WebArenaError(SiteError):
    """Base of the errors of the self-hosted WebArena adapter."""


class SiteURLError(WebArenaError):
    """A WebArena site URL (SHOPPING, ...) that is missing or not an http(s) URL."""

    def __init__(self, name: str, url: str, problem: str, *, source: str = "") -> None:
        self.name = name
        self.url = url
        self.problem = problem
        where = f"{source}: " if source else ""
        what = f"site URL {name}={url!r}" if url else name
        super().__init__(f"{where}{what}: {problem}")


class AuthError(WebArenaError):
    """Auto-login failed (the site, the account and what was seen are in the message), or a
    storage state file cannot be read or written."""


class ResetError(WebArenaError):
    """Resetting a WebArena instance failed or timed out; the instance leaves the pool."""

    def __init__(self, instance: str, problem: str) -> None:
        self.instance = instance
        self.problem = problem
        super().__init__(f"instance {instance!r}: reset failed: {problem}")


class NoInstanceError(WebArenaError):
    """Every WebArena instance of the pool has failed; no episode can run."""
