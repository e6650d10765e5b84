"""webagent-r1's runtime: messages, config, browsers, episodes, rollouts, the daemon.

Importing it does not import torch: the endpoint-only deployment runs without it.
"""

from importlib.metadata import PackageNotFoundError, version

from runtime.base.config import Config, ConfigError, load_config

try:
    __version__ = version("webagent-r1")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = ["Config", "ConfigError", "__version__", "load_config"]
