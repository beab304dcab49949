"""Roadie's loggers, which load structlog when a line is first logged rather than when their
module is imported: a listing or a help text logs nothing, and loading structlog (with the
parts of Rich its console renderer uses) is most of a tenth of a second of a command's start.
The command line's logging configuration waits for that moment too (`configure`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_setup: Callable[[], None] | None = None
_loaded = False


class _Logger:
    """Stands for `structlog.get_logger(name)`, and becomes it when first used."""

    __slots__ = ("_logger", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, attribute: str) -> Any:
        if self._logger is None:
            self._logger = _structlog().get_logger(self._name)
        return getattr(self._logger, attribute)


def get_logger(name: str) -> Any:
    """A logger named `name`, structlog's (Any: structlog's own types are not loaded here)."""
    return _Logger(name)


def configure(setup: Callable[[], None] | None) -> None:
    """Have `setup` configure structlog before the first line is logged: at once when a line
    has been. None forgets a setup that has not run yet."""
    global _setup
    _setup = setup
    if _loaded and setup is not None:
        _setup = None
        setup()


def _structlog() -> Any:
    global _loaded, _setup
    import structlog

    if not _loaded:
        _loaded = True
        setup, _setup = _setup, None
        if setup is not None:
            setup()
    return structlog
