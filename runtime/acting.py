"""Carrying out one action of the DSL on a `BrowserSession`'s current tab.

`BrowserSession.execute` bounds the whole action in time and polices the tabs after it;
`perform` here does the action itself:

- `go_backward` / `go_forward` move in the tab's history (no page there is an error);
- `Scroll Up` / `Scroll Down` move the window and the scroll containers on screen by 80% of
  the viewport, continuing exactly below the last line the model saw when it was cut;
- `Goto` refuses other hosts and every scheme but http(s) before navigating;
- the element actions (`Click`, `Type`, `Search`, `Hover`, `Right Click`, `Select Dropdown
  Option`) act on the element the last observation marked with that id, only after the
  page confirms it is still that element (its fingerprint, computed as observe.js does):
  an element gone, hidden or changed since is an `ElementNotFound`, never an action on
  another element.
"""

from __future__ import annotations

from typing import Final, Protocol
from urllib.parse import urljoin, urlsplit

import anyio
from playwright.async_api import Page

from runtime.actions import shorten
from runtime.base.config import BrowserConfig
from runtime.base.messages import Action
from runtime.errors import ActionError, ElementNotFound, NavigationBlocked, playwright_errors
from runtime.fence import Allowlist
from runtime.observation import ID_ATTRIBUTE, Observation

__all__ = ["ActionTarget", "perform"]


class ActionTarget(Protocol):
    """What an action needs of the episode's browser (`runtime.session.BrowserSession`)."""

    config: BrowserConfig
    allowlist: Allowlist
    pages: list[Page]
    active: Page | None
    # The last observation: the ids an element action may name.
    observation: Observation | None

    @property
    def page(self) -> Page: ...  # the current tab

    @property
    def navigation_timeout_ms(self) -> float: ...

    def expect_tab(self) -> anyio.Event: ...  # set when the next tab joins

    async def navigate(self, page: Page, url: str, *, action: bool = False) -> None: ...


# Finds the element marked `id` by the last observation and returns its fingerprint,
# computed exactly as observe.js does; null when it is gone, "hidden" when not shown now.
_CHECK: Final = """(a) => {
  const el = (window.__webagentMarks || [])[a.id - 1];
  if (!el || !el.isConnected || el.getAttribute(a.attr) !== String(a.id)) return null;
  // Hidden since it was shown (observe.js's own test): refused like a removed element.
  const shown = window.__webagentShown;
  if (typeof shown === "function" && !shown(el)) return "hidden";
  const collapse = (s) => s.replace(/\\s+/g, " ");
  const fp = el.tagName.toLowerCase() + "|" + collapse(el.textContent || "").trim().slice(0, 100) +
    "|" + (el.getAttribute("name") || "") + "|" + (el.getAttribute("type") || "");
  // Does a click open a new tab (a link or a form with a target other than this tab)?
  const other = (t) => !!t && !["_self", "_top", "_parent"].includes(t.toLowerCase());
  const link = el.closest("a[href], area[href]");
  const form = el.form || el.closest("form");
  const type = (el.type || "").toLowerCase();
  const submits = el.tagName === "BUTTON" || type === "submit" || type === "image";
  const target = form === null ? "" : el.getAttribute("formtarget") || form.getAttribute("target");
  const tab = (link !== null && other(link.getAttribute("target"))) || (submits && other(target));
  const r = el.getBoundingClientRect();
  return [fp, tab, !(r.width > 0 && r.height > 0), el.disabled === true];
}"""

# Scrolls the window to `y`, and each scroll container on screen by `step` (a sidebar that
# scrolls on its own moves along with the page).
_SCROLL: Final = """({y, step}) => {
  window.scrollTo({top: y, left: 0, behavior: 'instant'});
  for (const el of document.body ? document.body.querySelectorAll("*") : []) {
    if (el.scrollHeight <= el.clientHeight + 1 || el.tagName === "TEXTAREA") continue;
    const r = el.getBoundingClientRect();
    if (r.bottom <= 0 || r.top >= window.innerHeight || r.width === 0) continue;
    const o = getComputedStyle(el).overflowY;
    if (o !== "auto" && o !== "scroll") continue;
    el.scrollBy({top: step * el.clientHeight, behavior: "instant"});
  }
}"""


async def perform(
    session: ActionTarget, action: Action, *, ms: float, navigation_ms: float
) -> None:
    """Carry out `action` on `session`'s current tab; raises ActionError for the model.

    An element must become actionable within `ms`; a navigation the action starts gets
    `navigation_ms` on top (0 when the caller's own timeout bounds both)."""
    match action.kind:
        case "go_backward" | "go_forward":
            page = session.page
            before = page.url
            timeout = session.navigation_timeout_ms
            with playwright_errors(action.kind.replace("_", " "), action=True):
                if action.kind == "go_backward":
                    response = await page.go_back(timeout=timeout)
                else:
                    response = await page.go_forward(timeout=timeout)
            if response is None and page.url == before:
                where = "earlier" if action.kind == "go_backward" else "later"
                raise ActionError(f"there is no {where} page in this tab's history")
        case "exit":
            return
        case "do":
            await _do(session, action, ms, navigation_ms)
        case _:
            raise ActionError(f"unknown action kind {action.kind}")


async def _do(session: ActionTarget, action: Action, ms: float, navigation_ms: float) -> None:
    name = action.name
    if name in ("Scroll Up", "Scroll Down"):
        await _scroll(session, down=name == "Scroll Down")
    elif name == "Press Enter":
        page = session.page
        with playwright_errors("Press Enter", action=True):
            # Through the focused element, Playwright waits for the navigation a
            # form submission starts; page.keyboard would not.
            focused = page.locator("*:focus")
            if await focused.count():
                await focused.last.press("Enter", timeout=ms + navigation_ms)
            else:
                await page.keyboard.press("Enter")
    elif name == "Wait":
        await anyio.sleep(session.config.wait_action_s)
    elif name == "Switch Tab":
        index = int(action.argument or "0")
        if not 0 <= index < len(session.pages):
            raise ActionError(
                f"there is no tab {index}; open tabs are 0 to {len(session.pages) - 1}"
            )
        session.active = session.pages[index]
        with playwright_errors("Switch Tab", action=True):
            await session.active.bring_to_front()
    elif name == "Goto":
        await _goto(session, action.argument or "")
    else:
        await _on_element(session, action, ms, navigation_ms)


async def _on_element(
    session: ActionTarget, action: Action, ms: float, navigation_ms: float
) -> None:
    name = action.name
    element_id = action.element
    if element_id is None:
        raise ActionError(f"{name} needs an element id")
    observation = session.observation
    observed = observation.elements.get(element_id) if observation else None
    if observed is None:
        raise ElementNotFound(f"there is no element {element_id} in the current page view")
    page = session.page
    with anyio.move_on_after(session.config.observation_timeout_s) as scope:
        # A page that navigates meanwhile is an error for the model, not a dead browser.
        with playwright_errors(f"{name} on element {element_id}", action=True):
            current = await page.evaluate(_CHECK, {"id": element_id, "attr": ID_ATTRIBUTE})
    if scope.cancelled_caught:
        raise ActionError(f"the page did not answer while looking up element {element_id}")
    if current is None:
        raise ElementNotFound(f"element {element_id} is not on the page any more")
    if current == "hidden":
        raise ElementNotFound(f"element {element_id} is hidden now; look at the page again")
    fingerprint, opens_tab, boxless, disabled = current
    if observed.fingerprint and fingerprint != observed.fingerprint:
        raise ElementNotFound(
            f"element {element_id} changed since the page was shown; look at the page again"
        )
    if disabled and name in ("Click", "Type", "Search", "Select Dropdown Option"):
        raise ActionError(f"element {element_id} is disabled")
    locator = page.locator(f'[{ID_ATTRIBUTE}="{element_id}"]')
    what = f"{name} on element {element_id}"
    with playwright_errors(what, action=True):
        match name:
            case "Click":
                new_tab = session.expect_tab()
                if boxless:
                    # A styled checkbox hidden behind its label: click it as a label would.
                    await locator.dispatch_event("click", timeout=ms)
                else:
                    # Playwright's click also waits for a navigation it starts to
                    # commit: give that the navigation timeout on top.
                    await locator.click(timeout=ms + navigation_ms)
                if opens_tab:
                    # The new tab's page event comes after the click returns.
                    with anyio.move_on_after(session.config.navigation_timeout_s):
                        await new_tab.wait()
            case "Right Click":
                await locator.click(button="right", timeout=ms)
            case "Hover":
                await locator.hover(timeout=ms)
            case "Type":
                await locator.fill(action.argument or "", timeout=ms)
            case "Search":
                await locator.fill(action.argument or "", timeout=ms)
                await locator.press("Enter", timeout=ms + navigation_ms)
            case "Select Dropdown Option":
                index = _option_index(
                    observed.tag, observed.options, action.argument or "", element_id
                )
                await locator.select_option(index=index, timeout=ms)
            case _:
                raise ActionError(f"{name} does not act on an element")


async def _goto(session: ActionTarget, raw: str) -> None:
    url = raw.strip()
    base = session.page.url
    if "://" not in url and not url.startswith(
        ("about:", "data:", "javascript:", "file:", "chrome:")
    ):
        url = urljoin(base, url)
    if not session.allowlist.allows(url):
        scheme = urlsplit(url).scheme
        if scheme not in ("http", "https"):
            raise NavigationBlocked(
                f"Goto {shorten(url, 100)} refused: only http(s) URLs may be visited"
            )
        raise NavigationBlocked(
            f"Goto {shorten(url, 100)} blocked: only {session.allowlist.describe()} may be visited"
        )
    await session.navigate(session.page, url, action=True)


async def _scroll(session: ActionTarget, *, down: bool) -> None:
    obs = session.observation
    page = session.page
    height = session.config.viewport_height
    current = obs.scroll_y if obs else 0
    step = int(height * 0.8)
    if down:
        target = current + step
        # Continue exactly below the last line the model saw, if the text was cut.
        if obs and obs.lines_below and current + 50 < obs.shown_bottom < target:
            target = obs.shown_bottom
    else:
        target = max(0, current - step)
    with anyio.move_on_after(session.config.action_timeout_s) as scope:
        with playwright_errors("scroll", action=True):
            await page.evaluate(_SCROLL, {"y": target, "step": 0.8 if down else -0.8})
    if scope.cancelled_caught:
        raise ActionError("the page did not answer while scrolling")


def _option_index(tag: str, options: tuple[str, ...], wanted: str, element_id: int) -> int:
    """The index of the <select> option whose shown text `wanted` names.

    Exact text first, then ignoring case and spacing, then (for texts the observation cut
    with "…") the shown prefix.
    """
    if tag != "select":
        raise ActionError(f"element {element_id} is not a dropdown (<select>); click it instead")
    if wanted in options:
        return options.index(wanted)
    folded = " ".join(wanted.split()).casefold()
    for index, option in enumerate(options):
        if " ".join(option.split()).casefold() == folded:
            return index
    for index, option in enumerate(options):
        if option.endswith("…") and folded.startswith(option[:-1].casefold()):
            return index
    shown = ", ".join(repr(o) for o in options[:20])
    raise ActionError(f"element {element_id} has no option {wanted!r}; its options are {shown}")
