"""`webagent`: the command line.

One module per command group; each exposes `register(subparsers)` and sets `func` on its
parsers. `func(args)` returns the exit code. Errors a user can cause are mapped to exit
codes here, in one place: a bad config or request exits 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from runtime import __version__
from runtime.base.config import ConfigError
from runtime.errors import UsageError
from runtime.logs import configure_logging

__all__ = ["main"]

# Command groups, in the order `--help` lists them. A group is listed only when it works.
_COMMANDS = (
    "train",
    "eval",
    "rollout",
    "demos",
    "bc",
    "orm",
    "model",
    "sites",
    "tasks",
    "trajectories",
    "config",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="webagent",
        description="Train and serve web agents with online M-GRPO (WebAgent-R1).",
    )
    parser.add_argument("--version", action="version", version=f"webagent-r1 {__version__}")
    parser.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default="auto",
        help="log lines as JSON or for a console (auto: JSON unless stderr is a terminal)",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name in _COMMANDS:
        importlib.import_module(f"runtime.cli.{name}").register(sub)
    return parser


def _project_errors() -> tuple[type[Exception], ...]:
    """The roots of every package's own errors: reported in one line, exit code 1."""
    from learner.errors import LearnerError
    from policy.errors import PolicyError
    from runtime.errors import WebAgentError
    from sites.errors import SiteError

    return (WebAgentError, PolicyError, LearnerError, SiteError)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `webagent` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    configure_logging(format=args.log_format, level=args.log_level)
    # Whether this process is the command itself (the console script, `python -m
    # runtime.cli`), which a command may re-execute (runtime.cli.train), or a caller's.
    args.own_process = argv is None
    try:
        code: int = args.func(args)
    except (ConfigError, UsageError) as exc:
        print(f"webagent: error: {exc}", file=sys.stderr)
        return 2
    except _project_errors() as exc:
        print(f"webagent: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("webagent: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`webagent ... | head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the interpreter's final flush is quiet
        return 141  # as a shell reports a process killed by SIGPIPE
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
