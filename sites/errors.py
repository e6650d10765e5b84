"""Errors of the sites package.

    Exception
    └── SiteError                  base of everything `sites` raises on purpose
        ├── TaskFileError          a task file that cannot be used: names file, task, field
        ├── PlaceholderError       a `__SITE__` placeholder with no URL to put in its place
        ├── PageError              the browser failed under an evaluator (Playwright, converted)
        │   └── PageClosedError    the page or its browser is gone
        └── JudgeError             the fuzzy-match judge failed or answered unreadably (httpx)

Playwright and httpx errors are converted at one boundary each (`sites.evaluators` and
`sites.judge`) with `raise ... from exc`; none of theirs leaks out of this package.
"""

from __future__ import annotations

__all__ = [
    "JudgeError",
    "PageClosedError",
    "PageError",
    "PlaceholderError",
    "SiteError",
    "TaskFileError",
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


class JudgeError(SiteError):
    """The fuzzy-match judge could not be asked or gave no readable verdict."""
