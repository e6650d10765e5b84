"""Fixtures of the WebArena environment, eval and policy-stack tests.

- `fakes`: `tests/sites/webarena/fakes.py` (fake reset server, built-in sites as WebArena
  instances, accounts for the built-in login forms).
- `builtin_sites`: the five built-in sites served in-process once for the session.
- `browser_pool`: one `BrowserPool` (Chromium) for the session's episodes.
- `suite`: the built-in suite of seed 0.
- `wa_file(tasks)`: writes tasks as a WebArena-format task file (`fakes.as_webarena`
  names a built-in task's storage state the way WebArena does).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from runtime.base.config import BrowserConfig, SitesConfig
from runtime.base.messages import TaskConfig
from runtime.browser import BrowserPool
from sites.builtin import BuiltinSites, generate_suite, serve_builtin_sites
from sites.tasks import write_tasks

FAKES = Path(__file__).parents[2] / "sites" / "webarena" / "fakes.py"


@pytest.fixture(scope="session")
def fakes() -> ModuleType:
    name = "webarena_test_fakes"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, FAKES)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
async def builtin_sites(anyio_backend: str) -> AsyncIterator[BuiltinSites]:
    async with serve_builtin_sites(SitesConfig()) as sites:
        yield sites


@pytest.fixture(scope="session")
async def browser_pool(anyio_backend: str) -> AsyncIterator[BrowserPool]:
    async with BrowserPool(BrowserConfig(action_timeout_s=5.0, max_contexts=8)) as pool:
        yield pool


@pytest.fixture(scope="session")
def suite() -> dict[str, list[TaskConfig]]:
    return generate_suite(0)


@pytest.fixture
def wa_file(tmp_path: Path) -> Callable[[Sequence[TaskConfig]], Path]:
    def write(tasks: Sequence[TaskConfig]) -> Path:
        path = tmp_path / "webarena-tasks.json"
        write_tasks(path, list(tasks))
        return path

    return write
