"""The command line starts at once: what opens no database (`--help`, `--version`, shell
completion, a mistyped option) loads none of the engine, the store, their libraries, the
web stack or the remote client. Each case runs in a fresh interpreter, whose
`sys.modules` is then read; none is timed (benchmarks/cli_startup.py times them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from roadie.cli import conformance as cli_conformance
from roadie.conformance import RULE_NAMES

# Runs the app as the `roadie` script does, then writes the names of the loaded modules
# to the file named by its first argument.
SCRIPT = """
import json, sys
from roadie.cli.main import app
try:
    app(sys.argv[2:], prog_name="roadie")
except SystemExit:
    pass
with open(sys.argv[1], "w") as out:
    json.dump(sorted(sys.modules), out)
"""

# Packages, and the modules under them, that none of these cases may load.
HEAVY = (
    "roadie.engine",
    "roadie.store",
    "roadie.runtime",
    "roadie.registry",
    "roadie.remote",
    "roadie.definitions",
    "roadie.conformance",
    "roadie.web",
    "roadie.views",
    "sqlalchemy",
    "alembic",
    "aiosqlite",
    "psycopg",
    "asyncmy",
    "fastapi",
    "starlette",
    "uvicorn",
    "jinja2",
    "httpx",
    "yaml",
    "jsonschema",
    "structlog",
    "asyncio",
)


def loaded(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> tuple[list[str], str]:
    """The modules loaded by `roadie ARGS` in a fresh interpreter, and what it printed."""
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out), *args],
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.read_text()), done.stdout + done.stderr


def among(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    """The modules that are `packages` or under them."""
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        [],
        ["run", "--help"],
        ["run", "list", "--help"],
        ["event", "validate", "--help"],
        ["conformance", "--help"],
        ["serve", "--help"],
        ["sandbox", "serve", "--help"],
        ["run", "list", "--no-such-option"],
        ["run", "show", "not-a-number"],
        ["no-such-command"],
    ],
    ids=" ".join,
)
def test_help_version_and_mistakes_load_nothing_heavy(args: list[str], tmp_path: Path) -> None:
    """Help, the version and a command line Click refuses load no engine, store, web stack,
    remote client, nor their libraries."""
    modules, printed = loaded(args, tmp_path)
    assert among(modules, HEAVY) == []
    assert "roadie" in printed


def test_completion_loads_nothing_heavy(tmp_path: Path) -> None:
    """Completing a command's options loads nothing heavy either."""
    completion = {"_ROADIE_COMPLETE": "complete_bash", "COMP_WORDS": "roadie run list --st", "COMP_CWORD": "3"}
    modules, printed = loaded([], tmp_path, completion)
    assert among(modules, HEAVY) == []
    assert printed.split() == ["--status"]


def test_run_list_opens_the_database_alone(tmp_path: Path) -> None:
    """`roadie run list` on a database `roadie init` made reads the store and nothing more:
    no module is loaded, no engine built, no remote client; of the store, the queries of
    runs alone, not those of every other concern; Alembic is not loaded to find the
    schema at the newest migration; and the SQLite file is read with a blocking engine,
    without SQLAlchemy's asyncio extension (nor the ORM it loads), aiosqlite or the
    dialects of MySQL and PostgreSQL. It logs nothing, so structlog is not loaded."""
    subprocess.run([sys.executable, "-m", "roadie.cli.main", "init"], cwd=tmp_path, check=True, capture_output=True)
    modules, printed = loaded(["run", "list"], tmp_path)
    assert "roadie.store.runs" in modules
    unread = ("roadie.engine", "roadie.registry", "roadie.modules", "roadie.remote", "roadie.definitions", "alembic")
    assert among(modules, (*unread, "httpx", "fastapi", "yaml", "jinja2")) == []
    other_concerns = ("roadie.store.store", "roadie.store.drain", "roadie.store.ledger", "roadie.store.cleanups")
    assert among(modules, other_concerns) == []
    unused = ("sqlalchemy.ext.asyncio", "sqlalchemy.orm", "aiosqlite", "sqlalchemy.dialects.mysql")
    assert among(modules, (*unused, "sqlalchemy.dialects.postgresql", "structlog")) == []
    assert "┃ run ┃" in printed


def test_the_rule_names_in_the_help_are_the_checks() -> None:
    """`roadie conformance --rule` names the rules without loading the checks: the names it
    holds are those of the checks, in their order."""
    assert list(cli_conformance.RULE_NAMES) == RULE_NAMES


def test_logging_is_set_up_as_asked_when_a_command_first_logs(tmp_path: Path) -> None:
    """structlog is loaded, and configured, only when a command logs: the configuration
    asked for on the command line still governs its first line and the rest."""
    roadie = [sys.executable, "-m", "roadie.cli.main"]
    asked = subprocess.run([*roadie, "--log-level", "debug", "--log-json", "init"], cwd=tmp_path,
                           check=True, capture_output=True, text=True, timeout=60)  # fmt: skip
    lines = [json.loads(line) for line in asked.stderr.splitlines()]
    assert lines, asked.stderr
    assert (lines[0]["event"], lines[0]["level"]) == ("module loaded", "debug"), asked.stderr
    quiet = subprocess.run([*roadie, "init"], cwd=tmp_path, check=True, capture_output=True, text=True, timeout=60)
    assert "module loaded" not in quiet.stderr  # the default level is warning
