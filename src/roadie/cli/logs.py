"""Logging for the CLI, the only place that configures it.

What every command opens (settings, the store, the registry, an engine) is
`roadie.runtime.open_context`, shared with the web app.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Iterator

from roadie import log


@contextlib.contextmanager
def configured_logging(level: str = "warning", *, json: bool = False) -> Iterator[None]:
    """Logging for one command, set up when it first logs: one that logs nothing (a
    listing) never loads structlog (`roadie.log`)."""
    log.configure(functools.partial(configure_logging, level, json=json))
    try:
        yield
    finally:
        log.configure(None)


def configure_logging(level: str = "warning", *, json: bool = False) -> None:
    import structlog  # here: `roadie --help` loads this module, and logs nothing

    processors: list[structlog.typing.Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )


class _CurrentStderr:
    """Whatever `sys.stderr` is when a line is written, not when logging was set up
    (test runners and daemonisers replace it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()
