"""Errors of the built-in sites (subclasses of `sites.errors.SiteError`).

SiteError                      (sites.errors)
└── BuiltinSiteError           base of everything `sites.builtin` raises on purpose
    ├── TenantError            a tenant request that cannot be served (unknown site name)
    ├── ServeError             the sites could not start listening (address in use, ...)
    └── NotInSuiteError        plan_for() on a task the built-in suite did not generate
"""

from __future__ import annotations

from sites.errors import SiteError

__all__ = ["BuiltinSiteError", "NotInSuiteError", "ServeError", "TenantError"]


class BuiltinSiteError(SiteError):
    """Base of the built-in sites' own errors."""


class TenantError(BuiltinSiteError):
    """A tenant request that cannot be served, e.g. a login for a site that does not exist."""


class ServeError(BuiltinSiteError):
    """The built-in sites could not start serving."""


class NotInSuiteError(BuiltinSiteError):
    """A task that the built-in suite did not generate (so it has no scripted plan)."""
