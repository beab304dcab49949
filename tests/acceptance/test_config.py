"""roadie.toml as an operator writes it, mistakes included: every key is checked when the
file is read, before anything is opened or written, and a mistake is one line naming the
key, exit 78."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from roadie.cli.main import app
from roadie.config import check_file, load_settings
from roadie.errors import ConfigError
from roadie.runtime import engine_options
from roadie.store import Store
from roadie.store.dialects import redacted
from tests.databases import PLANTED_PASSWORD, Database, check_reachable

runner = CliRunner()


def roadie(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder to write roadie.toml in; the database a SQLite file there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ROADIE_DATABASE_URL", raising=False)
    monkeypatch.delenv("ROADIE_CONFIG", raising=False)
    return tmp_path


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ('[engine]\nclaim_ttl = "abc"\n', "engine.claim_ttl: Input should be a valid number, not 'abc'"),
        ('[engine]\nconcurrency = "lots"\n', "engine.concurrency: Input should be a valid integer, not 'lots'"),
        ("[engine]\nconcurrency = 0\n", "engine.concurrency: Input should be greater than or equal to 1, not 0"),
        ("[engine]\nclaim_ttl = -5\n", "engine.claim_ttl: Input should be greater than 0, not -5"),
        ("[engine]\nconcurrency = 2.5\n", "engine.concurrency: Input should be a valid integer, not 2.5"),
        ("[engine]\npoll_interval = true\n", "engine.poll_interval: Input should be a valid number, not True"),
        ("[engine]\nconcurency = 4\n", "engine.concurency: unknown key; did you mean engine.concurrency?"),
        ('database_ulr = "sqlite:///elsewhere.db"\n', "database_ulr: unknown key; did you mean database_url?"),
        ("concurrency = 4\n", "concurrency: unknown key; it belongs under [engine]: engine.concurrency"),
        (
            '[engine]\nconcurrency = 4\ndatabase_url = "sqlite:///x.db"\n',
            "engine.database_url: unknown key; database_url belongs at the top, before the first [table]",
        ),
        ("database_url = 5\n", "database_url: Input should be a valid string, not 5"),
        ("modules = 5\n", "modules: Input should be a valid dictionary, not 5"),
        ("[modules.mygame]\nimport = 3\n", "modules.mygame.import: Input should be a valid string, not 3"),
        ("[modules.old]\nenabled = 'no'\n", "modules.old.enabled: Input should be a valid boolean, not 'no'"),
        (
            '[modules.world]\ntransport = "poll"\n',
            "modules.world.transport: Input should be 'push' or 'pull', not 'poll'",
        ),
        (
            '[modules.world]\nurl = "http://x"\nconnect_timeout = "2"\n',
            "modules.world.connect_timeout: Input should be a valid number, not '2'",
        ),
        (
            '[modules.world]\nurl = "http://x"\nmax_connections = 0\n',
            "modules.world.max_connections: Input should be greater than or equal to 1, not 0",
        ),
        (
            '[modules.world]\nurl = "http://x"\nsecret = 1234567\n',
            "modules.world.secret: should be a string, or a list of strings while one is rotated out",
        ),
        ('[[webhooks]]\nname = "ops"\nurl = "ftp://x"\n', "webhooks[0].url"),
        (
            '[modules.game]\nconsole = "game.toml"\ntimeout = "abc"\n',
            "modules.game: timeout should be a number of seconds over 0, not 'abc'",
        ),
        ('[modules.game]\nconsole = "game.toml"\naddress = 27015\n', "modules.game: address should be a non-empty"),
    ],
)
def test_a_mistake_in_roadie_toml_is_one_line_naming_the_key_and_exit_78(folder: Path, toml: str, says: str) -> None:
    """Before: a text claim_ttl was a TypeError traceback from every command, a text
    concurrency a traceback after the worker had registered itself with it, 0 and -5
    were taken, and a misspelled key was ignored (`database_ulr` fell back to
    sqlite:///roadie.db, `concurency = 4` ran with 32). Now each is one line naming the
    key, for a command that only reads and for a worker alike, and nothing is made."""
    (folder / "roadie.toml").write_text(toml)
    commands = [["worker"], ["init"], ["workers"]]
    if not toml.startswith("[[webhooks]]"):  # `run list` reads the store alone: it sends no webhook
        commands.append(["run", "list"])
    for command in commands:
        code, out = roadie(*command)
        assert code == 78, (command, out)
        [line] = out.strip().splitlines()
        assert line.startswith("error roadie.toml: "), line
        assert says in line, line
    code, out = roadie("workers", "--json")
    error = json.loads(out)["error"]
    assert (code, error["kind"]) == (78, "config")
    assert sorted(p.name for p in folder.iterdir()) == ["roadie.toml"], "nothing is made or written"


@pytest.mark.parametrize(
    "table",
    [{"url": "http://x", "secret": 987654321}, {"console": "game.toml", "password": 987654321}],
)
def test_a_secret_of_the_wrong_type_is_not_shown(table: dict[str, object]) -> None:
    """A module's secret or a console's password given as a number is refused without
    printing it."""
    with pytest.raises(ConfigError) as caught:
        check_file({"modules": {"world": table}}, "roadie.toml")
    assert "987654321" not in caught.value.message


def test_every_problem_is_named_on_the_one_line(folder: Path) -> None:
    """Several mistakes are all named, in the file's order within each table."""
    (folder / "roadie.toml").write_text('database_ulr = "x"\n[engine]\nclaim_ttl = "abc"\nconcurency = 4\n')
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert caught.value.message == (
        "roadie.toml: engine.claim_ttl: Input should be a valid number, not 'abc'; "
        "engine.concurency: unknown key; did you mean engine.concurrency?; "
        "database_ulr: unknown key; did you mean database_url?"
    )


def test_a_good_file_is_read_as_written(folder: Path) -> None:
    """Every documented key is accepted with its documented type (an integer where
    seconds are asked for included), and a module's own keys are left to its setup."""
    (folder / "roadie.toml").write_text(
        'database_url = "sqlite:///other.db"\n'
        "[engine]\nconcurrency = 8\nclaim_ttl = 30\npoll_interval = 0.5\ncleanups = 2\nsweep_interval = 0\n"
        "cleanup_cap = 500\nclaim_ahead = 0\nseed = 7\n"
        "[engine.cleanup_caps]\nsandbox = 2000\n"
        '[modules.sandbox]\ndb = "w.db"\nanything = {nested = [1, "two"]}\ntimeout = "its own"\naddress = 5\n'
        '[modules.world]\nurl = "http://10.0.0.5:7300"\nsecret = ["whsec_a", "whsec_b"]\nconnect_timeout = 2\n'
        "read_timeout = 30.0\ncall_timeout = 60\nmax_connections = 10\n"
        '[modules.luamod]\ntransport = "pull"\nsecret_env = "LUA_SECRET"\n'
        '[modules.mygame]\nimport = "mygame.roadie_module:module"\n'
        "[modules.oldthing]\nenabled = false\n"
        '[[webhooks]]\nname = "ops"\nurl = "https://example.invalid/hook"\nformat = "discord"\n'
    )
    settings = load_settings()
    assert settings.database_url == "sqlite:///other.db"
    assert settings.engine["claim_ttl"] == 30
    assert settings.modules["sandbox"] == {
        "db": "w.db",
        "anything": {"nested": [1, "two"]},
        "timeout": "its own",
        "address": 5,
    }
    assert settings.modules["mygame"] == {"import": "mygame.roadie_module:module"}
    options = engine_options(settings)
    assert (options.concurrency, options.claim_ttl, options.sweep_interval) == (8, 30.0, 0)
    assert options.cleanup_caps == {"sandbox": 2000}


def test_workers_lists_a_worker_an_unchecked_file_registered(folder: Path) -> None:
    """Before roadie.toml was checked, a worker with `concurrency = "lots"` registered
    itself with that text (SQLite keeps it), and from then on `roadie workers` failed
    with `ValueError: invalid literal for int()`. It lists it now, beside the others."""
    url = f"sqlite:///{folder / 'roadie.db'}"

    async def register() -> None:
        store = await Store.open(url)
        try:
            now = datetime.now(UTC)
            await store.register_worker("w-bad", host="h", pid=1, concurrency="lots", version="0", now=now)  # type: ignore[arg-type]
            await store.register_worker("w-good", host="h", pid=2, concurrency=4, version="0", now=now)
        finally:
            await store.close()

    asyncio.run(register())
    code, out = roadie("workers", "--json", "--database-url", url)
    assert code == 0, out
    found = {w["worker_id"]: w["concurrency"] for w in json.loads(out)}
    assert found == {"w-bad": 0, "w-good": 4}


@pytest.fixture
def postgresql(tmp_path: Path) -> Iterator[str]:
    """A fresh PostgreSQL database's URL (the suite's planted password in it)."""
    problem = check_reachable("postgresql")
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    database = Database("postgresql")
    yield database.fresh(tmp_path)
    database.drop_all()


def test_postgresql_urls_as_libpq_and_hosting_providers_write_them(folder: Path, postgresql: str) -> None:
    """Before: several hosts in libpq's comma form were a ValueError traceback (exit 1),
    and `postgres://` 'no database Roadie can use' (exit 78). Now both open the database:
    the hosts are tried in order, the first refusing connections."""
    server = make_url(postgresql)
    several = postgresql.replace(f"@{server.host}:{server.port}/", f"@127.0.0.1:1,{server.host}:{server.port}/")
    for url in (several + "?target_session_attrs=read-write", postgresql.replace("postgresql://", "postgres://")):
        code, out = roadie("init", "--database-url", url)
        assert code == 0, out
        code, out = roadie("run", "list", "--database-url", url)
        assert code == 0, out
    code, out = roadie("run", "list", "--database-url", several.replace(f"{server.host}:{server.port}", "127.0.0.1:2"))
    assert code == 69, out
    [line] = out.strip().splitlines()
    assert "Connection refused" in line


def test_a_password_in_the_query_is_never_shown(folder: Path, postgresql: str) -> None:
    """Before: `?password=...` (libpq's own parameter, and the form some tools write) was
    printed by `roadie init`, the worker's first line and every connection error. The
    suite's planted password is now in the query; the check that no command prints it
    is tests/conftest.py's."""
    server = make_url(postgresql)
    assert server.password == PLANTED_PASSWORD
    url = server.set(password=None).update_query_dict({"password": PLANTED_PASSWORD})
    given = url.render_as_string(hide_password=False)
    assert PLANTED_PASSWORD in given
    code, out = roadie("init", "--database-url", given)
    assert (code, out.strip()) == (0, f"database ready: {redacted(given)}"), out
    assert "password=***" in out
    code, out = roadie("run", "list", "--database-url", given.replace(f":{server.port}/", ":1/"))
    assert code == 69, out
    assert "password=***" in out
    assert redacted(f"postgresql://u@h:port/db?password={PLANTED_PASSWORD}") == "postgresql://…"
