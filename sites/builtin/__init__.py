"""The built-in sites: five WebArena-like sites served in-process, with per-episode tenants.

    TENANT_COOKIE          the one cookie the runtime sets per BrowserContext
    SITE_NAMES             WebArena env name -> task `sites` name ("SHOPPING" -> "shopping")
    BuiltinSites           data, tenants and apps: urls, create_tenant, drop_tenant, statistics
    ADMIN_HEADER           the header the tenant API needs (value: BuiltinSites.admin_token)
    serve_builtin_sites    async context manager serving the five sites on 127.0.0.1
    generate_suite(seed)   {"train", "test", "ood"} lists of TaskConfig, deterministic
    plan_for(task)         the scripted solution (OracleSteps) of a task from the suite
    plan_length(task)      its number of steps, or None for a task not from the suite

Sites: shop (SHOPPING), admin (SHOPPING_ADMIN), forum (REDDIT), code (GITLAB), map (MAP),
one port each. Default accounts (`data.ACCOUNTS`) are WebArena's account names.
"""

from sites.builtin.server import ADMIN_HEADER, SITE_NAMES, BuiltinSites, serve_builtin_sites
from sites.builtin.suite import generate_suite, plan_for, plan_length
from sites.builtin.web import TENANT_COOKIE

__all__ = [
    "ADMIN_HEADER",
    "SITE_NAMES",
    "TENANT_COOKIE",
    "BuiltinSites",
    "generate_suite",
    "plan_for",
    "plan_length",
    "serve_builtin_sites",
]
