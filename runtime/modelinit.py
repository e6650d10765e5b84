"""Making the test suite's tiny model (the corpus its tokenizer is trained on).

The policy layer makes the model from texts (`policy.tiny.make_tiny_model`) and must not
know about sites; this module composes the texts: the policy's own (system prompt, DSL
completions in ChatML), the built-in suite's train intents, and the built-in sites' pages
as a logged-in visitor sees them (crawled in-process through ASGI from the front pages
and the train tasks' start pages: no browser, no sockets). Deterministic for a seed.
"""

from __future__ import annotations

import re
from collections import deque
from pathlib import Path
from urllib.parse import urldefrag, urlsplit

import anyio
import httpx

from policy.tiny import (
    TINY_RECIPE,
    TinyModelInfo,
    TinyModelSpec,
    TokenizerRecipe,
    base_corpus,
    make_tiny_model,
)
from runtime.base.config import SitesConfig
from sites.builtin import SITE_NAMES, TENANT_COOKIE, BuiltinSites, generate_suite

__all__ = ["gather_corpus", "init_tiny_model", "site_pages", "task_intents"]

_HREF = re.compile(r"""href="([^"#]*)""")
_DROP = re.compile(r"<(script|style)\b.*?</\1>", re.DOTALL | re.IGNORECASE)
_BLANK_LINES = re.compile(r"\n\s*\n+")
# Links a crawl must not follow: they change the session, not the page.
_SKIP = ("logout", "sign_out", "signout", "/__webagent")


def task_intents(seed: int, split: str = "train") -> list[str]:
    """The built-in suite's task intents of one split."""
    return [task.intent for task in generate_suite(seed)[split]]


def _clean(html: str) -> str:
    return _BLANK_LINES.sub("\n", _DROP.sub("", html)).strip()


async def site_pages(seed: int, *, pages_per_site: int = 40) -> list[str]:
    """Pages of the built-in sites (scripts and styles dropped), crawled breadth-first
    from each site's front page and the train tasks' start pages, logged in everywhere."""
    sites = BuiltinSites(SitesConfig(seed=seed))
    starts: dict[str, list[str]] = {env: ["/"] for env in SITE_NAMES}
    for task in generate_suite(seed)["train"]:
        env, _, path = task.start_url.partition("/")
        paths = starts.get(env.strip("_"))
        if paths is not None and f"/{path}" not in paths:
            paths.append(f"/{path}")
    tenant = sites.create_tenant(logged_in=list(SITE_NAMES.values()))
    pages: list[str] = []
    try:
        for env, app in sites.apps.items():
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app),
                base_url="http://site.local",
                cookies={TENANT_COOKIE: tenant},
            ) as http:
                pages += await _crawl(http, starts[env], pages_per_site)
    finally:
        sites.drop_tenant(tenant)
    return pages


async def _crawl(http: httpx.AsyncClient, starts: list[str], limit: int) -> list[str]:
    queue: deque[str] = deque(starts)
    seen = set(starts)
    pages: list[str] = []
    while queue and len(pages) < limit:
        path = queue.popleft()
        response = await http.get(path, follow_redirects=True)
        if response.status_code != 200 or "html" not in response.headers.get("content-type", ""):
            continue
        pages.append(_clean(response.text))
        for href in _HREF.findall(response.text):
            link = urldefrag(href).url
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or not link.startswith("/"):
                continue
            if link in seen or any(skip in link for skip in _SKIP):
                continue
            seen.add(link)
            queue.append(link)
    return pages


async def gather_corpus(seed: int, *, pages_per_site: int = 40) -> list[str]:
    """Every text the tiny model's tokenizer is trained on, in a fixed order."""
    pages = await site_pages(seed, pages_per_site=pages_per_site)
    return base_corpus(seed) + task_intents(seed) + pages


async def init_tiny_model(
    out: str | Path,
    *,
    seed: int = 0,
    overwrite: bool = False,
    spec: TinyModelSpec = TinyModelSpec(),
    recipe: TokenizerRecipe = TINY_RECIPE,
) -> TinyModelInfo:
    """Gather the corpus and make the tiny model at `out` (torch runs in a worker thread)."""
    texts = await gather_corpus(seed)

    def make() -> TinyModelInfo:
        return make_tiny_model(out, texts, spec=spec, recipe=recipe, seed=seed, overwrite=overwrite)

    return await anyio.to_thread.run_sync(make)
