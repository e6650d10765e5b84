"""Errors of the runtime.

    Exception
    ├── ConfigError            (runtime.base.config: a bad configuration file)
    └── WebAgentError          base of everything the runtime raises on purpose
        ├── UsageError         a bad command-line request (exit code 2)
        ├── ParseError         a completion that is not one action of the DSL
        ├── ActionError        an action that could not be carried out on this page
        │   ├── ElementNotFound    an element id that is not (or no more) on the page
        │   └── NavigationBlocked  a URL outside the allowlist, or a refused scheme
        ├── ObservationError   the page could not be observed in time
        ├── BrowserError       Chromium (or this episode's context) is gone: error:browser
        └── StoreError         a trajectory store that cannot be read or written

`ParseError`, `ActionError` and `ObservationError` carry a message meant for the model: the
episode shows it in the next observation and goes on. `BrowserError` ends the episode
with status `error:browser`.

Playwright's exceptions are converted in one place, `playwright_errors()`: every call
into Playwright made by the runtime runs inside it, so none leaks out of the runtime.

Errors of other packages have their own roots (`policy.errors.PolicyError`,
`learner.errors.LearnerError`, `sites.errors.SiteError`); the CLI maps each to an exit
code at one place.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import TimeoutError as PlaywrightTimeoutError

from runtime.base.config import ConfigError

__all__ = [
    "ActionError",
    "BrowserError",
    "ConfigError",
    "ElementNotFound",
    "NavigationBlocked",
    "ObservationError",
    "ParseError",
    "StoreError",
    "UsageError",
    "WebAgentError",
    "is_closed",
    "playwright_errors",
]


class WebAgentError(Exception):
    """Base of the runtime's own errors."""


class UsageError(WebAgentError):
    """A command-line request that cannot be carried out as asked."""


class ParseError(WebAgentError):
    """A completion that is not exactly one action of the DSL; the message is for the model."""


class ActionError(WebAgentError):
    """An action that could not be carried out; the message is for the model."""


class ElementNotFound(ActionError):
    """An element id that the current page does not hold (or no longer holds)."""


class NavigationBlocked(ActionError):
    """A navigation to a host outside the allowlist or to a refused URL scheme."""


class ObservationError(WebAgentError):
    """The page could not be observed (script timeout, page busy)."""


class BrowserError(WebAgentError):
    """The browser or this episode's context or page is gone; the episode cannot go on."""


class StoreError(WebAgentError):
    """A trajectory store that cannot be opened, read or appended to."""


# Substrings of Playwright messages meaning the browser, context or page is gone.
_CLOSED = (
    "Target closed",
    "Target page, context or browser has been closed",
    "Browser has been closed",
    "browser has disconnected",
    "Connection closed",
    "Target crashed",
    "Page crashed",
    "has been closed",
)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def is_closed(exc: BaseException) -> bool:
    """Is this Playwright error about a closed (or crashed) page, context or browser?"""
    message = _first_line(exc)
    return type(exc).__name__ == "TargetClosedError" or any(s in message for s in _CLOSED)


@contextmanager
def playwright_errors(what: str, *, action: bool = False) -> Iterator[None]:
    """Convert Playwright's exceptions raised inside into the runtime's own.

    A closed target becomes `BrowserError`. Any other Playwright error (a timeout, an
    element that cannot be clicked, a failed navigation) becomes `ActionError` when
    `action` is true (the model sees `what` and the reason) and `BrowserError` otherwise.
    """
    try:
        yield
    except PlaywrightTimeoutError as exc:
        if action:
            raise ActionError(f"{what}: timed out") from exc
        raise BrowserError(f"{what}: timed out") from exc
    except PlaywrightError as exc:
        message = _first_line(exc)
        if is_closed(exc):
            raise BrowserError(f"{what}: {message}") from exc
        if action:
            raise ActionError(f"{what}: {_for_model(message)}") from exc
        raise BrowserError(f"{what}: {message}") from exc


def _for_model(message: str) -> str:
    """A Playwright message trimmed of its API prefix ("Locator.click: ...")."""
    head, sep, tail = message.partition(": ")
    if sep and "." in head and " " not in head:
        return tail
    return message
