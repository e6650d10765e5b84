"""Fixtures of the WebArena adapter's tests; the fakes live in `fakes.py`.

- `fakes`: the `fakes` module (fake reset server, built-in sites as instances).
- `builtin_sites`: the five built-in sites served in-process once for the session.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import pytest

from runtime.base.config import SitesConfig
from sites.builtin import BuiltinSites, serve_builtin_sites

FAKES = Path(__file__).with_name("fakes.py")


def load_fakes() -> ModuleType:
    """`fakes.py` as one module shared by both WebArena test folders."""
    name = "webarena_test_fakes"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, FAKES)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def fakes() -> ModuleType:
    return load_fakes()


@pytest.fixture(scope="session")
async def builtin_sites(anyio_backend: str) -> AsyncIterator[BuiltinSites]:
    async with serve_builtin_sites(SitesConfig()) as sites:
        yield sites
