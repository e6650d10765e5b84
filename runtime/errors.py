"""Errors of the runtime.

    Exception
    ├── ConfigError            (runtime.config: a bad configuration file)
    └── WebAgentError          base of everything the runtime raises on purpose
        └── UsageError         a bad command-line request (exit code 2)

Errors of other packages have their own roots (`policy.errors.PolicyError`,
`learner.errors.LearnerError`, `sites.errors.SiteError`); the CLI maps each to an exit
code at one place.
"""

from __future__ import annotations

from runtime.config import ConfigError

__all__ = ["ConfigError", "UsageError", "WebAgentError"]


class WebAgentError(Exception):
    """Base of the runtime's own errors."""


class UsageError(WebAgentError):
    """A command-line request that cannot be carried out as asked."""
