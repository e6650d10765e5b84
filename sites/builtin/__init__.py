"""The built-in sites: five WebArena-like sites served in-process, with per-episode tenants."""

from sites.builtin.server import SITE_NAMES, BuiltinSites, serve_builtin_sites
from sites.builtin.web import TENANT_COOKIE

__all__ = ["SITE_NAMES", "TENANT_COOKIE", "BuiltinSites", "serve_builtin_sites"]
