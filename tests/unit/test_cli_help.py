"""What `--help` says: every command's help names its values by what they are, and
`roadie --help` lists the commands as an operator meets them. Nothing here opens a
database: help never does."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer
from typer.testing import CliRunner

from roadie.cli.main import Roadie, app

runner = CliRunner()

# A Python type as Typer prints it (`<str>`, `<list[str]>`, `<int range>`, `<path>`), or
# Click's name for one (`TEXT`, `INTEGER`).
PYTHON_TYPE = re.compile(r"<[a-z_]+(?:\[[^>]*\])?(?: range)?>|\b(?:TEXT|INTEGER|FLOAT|BOOLEAN)\b|NoneType")


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command's words under `command` (itself first), groups included."""
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


def help_of(*words: str) -> str:
    result = runner.invoke(app, [*words, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def test_no_help_shows_a_python_type() -> None:
    """Before: `-p, --param <list[str]>`, `--database-url <str>`, `RUN <int>` and 60 more.
    Now each value is named by what it is (`NAME=VALUE`, `URL`, `RUN`), in every command's
    help, groups and the top level included."""
    found = [
        f"roadie {' '.join(words)}: {line.strip()}"
        for words in commands(typer.main.get_command(app))
        for line in help_of(*words).splitlines()
        if PYTHON_TYPE.search(line)
    ]
    assert found == [], "\n".join(found)
    assert "-p, --param NAME=VALUE" in help_of("run", "start")
    assert "--target LEASE=TARGET" in help_of("conformance")


def test_the_commands_are_listed_as_an_operator_meets_them() -> None:
    """Before: `conformance` and `secret` first, the groups (`event`, `run`) last. Now
    under headings, from `init`, `event`, `run` and `cleanup` to a module author's tools;
    every command is placed under one, and completion offers them in the same order."""
    placed = [name for _, names in Roadie.sections for name in names]
    assert sorted(placed) == sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    listed = re.findall(r"^  ([a-z]+) ", help_of(), re.MULTILINE)
    assert listed == placed
    assert placed[:4] == ["init", "event", "run", "cleanup"]
    assert placed[-3:] == ["actions", "conformance", "secret"]
    headings = [line.rstrip(":") for line in help_of().splitlines() if re.fullmatch(r"[A-Z][a-z ]+:", line)]
    assert headings == ["Options", *(title for title, _ in Roadie.sections)]
    completion = {"_ROADIE_COMPLETE": "complete_bash", "COMP_WORDS": "roadie ", "COMP_CWORD": "1"}
    offered = runner.invoke(app, [], env=completion, prog_name="roadie").output.split()
    assert offered == placed
