"""structlog, configured once at the CLI edge.

JSON lines when the log stream is not a terminal, the console renderer when it is;
episode, group and adapter ids are bound through contextvars (`bind_ids`), so every line
a unit of work writes carries them.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, TextIO

import structlog

__all__ = ["bind_ids", "configure_logging"]

LogFormat = Literal["auto", "json", "console"]


def configure_logging(
    *, format: LogFormat = "auto", level: str = "info", stream: TextIO | None = None
) -> None:
    """Route structlog to `stream` (stderr by default) as JSON or console lines."""
    out = stream if stream is not None else sys.stderr
    as_json = format == "json" or (format == "auto" and not out.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )


@contextmanager
def bind_ids(**ids: str | int) -> Iterator[None]:
    """Bind ids (episode_id=..., group_id=..., adapter=...) to every log line inside."""
    with structlog.contextvars.bound_contextvars(**ids):
        yield
