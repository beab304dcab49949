"""The command line as an operator expects it to behave: data printed as data, nothing
made by a command that only looks, a worker that notices its database is gone, Ctrl-C
on `--wait` that says what it leaves behind, flags shown as flags."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from roadie.cli.main import app
from tests.acceptance.test_cli import QUICK_EVENT
from tests.databases import PLANTED_PASSWORD, Database

runner = CliRunner()

# Text that Rich markup would take as a closing tag (and crash on), in every place data
# reaches the screen: an event's title, a param, a step's error.
MARKUP_EVENT = """\
id: bracket-raid
title: "Raid [/] [bold]not bold[/bold]"
params:
  region: {type: str, default: yew}
cleanup: auto
phases:
  - name: "omen [/]"
    steps:
      - action: sandbox.broadcast
        with: {message: "Raiders near {{ region }}"}
      - action: sandbox.spawn
        name: raiders
        with: {kind: "[/]", region: "{{ region }}", count: 1}
"""


def roadie(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder, the database and world files to be made in it, if at all."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ROADIE_DATABASE_URL", raising=False)
    monkeypatch.delenv("ROADIE_CONFIG", raising=False)
    return tmp_path


def test_data_holding_markup_is_printed_as_written(folder: Path) -> None:
    """Before: `[/` in a param, a title or an error crashed `run list` and `run show` with
    a markup traceback, for every run in the list. Now it is printed as written, and a
    table piped to a file is not cut at 80 columns."""
    (folder / "raid.yaml").write_text(MARKUP_EVENT)
    code, out = roadie("run", "start", "raid.yaml", "-p", "region=[/]", "--wait")
    assert code == 1, out  # the world has no such region: the step's error quotes it
    assert "raiders: sandbox: no region '[/]'" in out
    code, out = roadie("run", "list")
    assert code == 0, out
    assert "sandbox: no region '[/]'" in out
    code, out = roadie("run", "show", "1")
    assert code == 0, out
    assert '"region": "[/]"' in out
    assert "omen [/]" in out
    longest = max(len(line) for line in out.splitlines())
    assert longest > 80, out  # piped: as wide as the widest row, nothing folded
    code, out = roadie("event", "list")
    assert "Raid [/] [bold]not bold[/bold]" in out


def test_validate_creates_nothing_where_it_is_run(folder: Path) -> None:
    """Before: `event validate` ("without storing it") made roadie.db and sandbox.db in
    the folder it ran in. Now the folder is as it was, and a bad file is still refused."""
    (folder / "quick.yaml").write_text(QUICK_EVENT)
    code, out = roadie("event", "validate", "quick.yaml")
    assert code == 0, out
    assert "ok" in out
    (folder / "bad.yaml").write_text(QUICK_EVENT.replace("sandbox.spawn", "sandbox.spwan"))
    code, out = roadie("event", "validate", "bad.yaml")
    assert code == 65
    assert "did you mean 'sandbox.spawn'" in out
    assert sorted(p.name for p in folder.iterdir()) == ["bad.yaml", "quick.yaml"]


def test_commands_that_only_read_create_nothing_where_nothing_is(folder: Path) -> None:
    """Before: `run list`, `audit`, `workers` and the other listings made an empty
    roadie.db (and sandbox.db) wherever they were run, so a typo'd folder looked like one
    where nothing had happened. Now they answer from an empty stand-in, say that there is
    no database here yet, and leave the folder as it was; `run show 1` is 'no run 1'."""
    for command in (
        ["run", "list"], ["event", "list"], ["audit"], ["leases"], ["workers"], ["token", "list"],
        ["webhooks", "list"], ["run", "list", "--json"],
    ):  # fmt: skip
        code, out = roadie(*command)
        assert code == 0, (command, out)
        assert "no database here yet" in out, (command, out)
    code, out = roadie("run", "show", "1")
    assert code == 66, out
    assert "no run 1" in out
    assert list(folder.iterdir()) == []
    code, out = roadie("init")
    assert code == 0, out
    code, out = roadie("run", "list")
    assert (code, "no database here yet" in out) == (0, False), out


def test_a_module_file_beside_roadie_toml_is_importable(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module in `mygame.py` next to `roadie.toml` is found without PYTHONPATH, wherever
    the command is run from."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the folder it adds goes with this test
    config = folder / "conf"
    config.mkdir()
    (config / "mygame_beside.py").write_text(
        "from roadie.registry.module import Answer, Module, Reversible\n"
        "module = Module('mygame')\n"
        "@module.action('greet', reversible=Reversible.NONE)\n"
        "async def greet(call):\n"
        "    return Answer()\n"
    )
    (config / "roadie.toml").write_text(
        f'database_url = "sqlite:///{folder}/roadie.db"\n[modules.mygame]\nimport = "mygame_beside:module"\n'
    )
    (folder / "greet.yaml").write_text(
        "id: greet\ntitle: Greet\nphases:\n  - name: hello\n    steps:\n      - action: mygame.greet\n"
    )
    code, out = roadie("event", "validate", "greet.yaml", "--config", str(config / "roadie.toml"))
    assert code == 0, out


def test_version_and_flags_shown_as_flags() -> None:
    """`--version` answers; help shows `--json` as a flag, not `--json <bool>`, and every
    command's argument in capitals."""
    code, out = roadie("--version")
    assert code == 0
    assert out.startswith("roadie ")
    for command in (["run", "list"], ["run", "show"], ["event", "validate"], ["cleanup"], ["serve"]):
        code, out = roadie(*command, "--help")
        assert code == 0, out
        assert "<bool>" not in out, out
    assert "FILE" in roadie("event", "validate", "--help")[1]
    assert "RUN" in roadie("run", "show", "--help")[1]


def _spawn(folder: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "roadie.cli.main", *args],
        cwd=folder,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )


def _wait_for(predicate: object, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_worker_whose_database_file_is_deleted_stops_and_says_so(folder: Path) -> None:
    """Before: deleting roadie.db under a running worker went unnoticed; the worker went
    on in the deleted file. Now it stops within a poll and says why, exit 69."""
    assert roadie("init")[0] == 0
    worker = _spawn(folder, "worker")
    try:
        _wait_for(
            lambda: json.loads(roadie("workers", "--json")[1] or "[]") != [], "the worker to register", timeout=60
        )
        (folder / "roadie.db").unlink()
        _, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 69, err
    assert f"the database file {folder / 'roadie.db'} was deleted" in err


SLOW_EVENT = QUICK_EVENT.replace("id: quick-raid", "id: slow-raid").replace(
    "  - name: raid\n", "  - name: raid\n    after: 10m\n"
)


def test_ctrl_c_on_wait_says_what_it_leaves_and_hands_the_run_to_the_workers(folder: Path) -> None:
    """Before: Ctrl-C on `run start --wait` exited 130 in half a second without a word,
    the run left running with its lease held. Now it stops once what was in flight has
    answered and says what it leaves in the world and who carries it on; a worker
    started afterwards finishes the run and cleans up."""
    (folder / "slow.yaml").write_text(SLOW_EVENT)
    assert roadie("init")[0] == 0
    waiting = _spawn(folder, "run", "start", "slow.yaml", "--wait")

    def omen_done() -> bool:
        code, out = roadie("run", "show", "1", "--json")
        return code == 0 and sum(r["state"] == "live" for r in json.loads(out)["resources"]) >= 1

    try:
        _wait_for(omen_done, "the first phase to borrow the weather")
        waiting.send_signal(signal.SIGINT)
        _, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    assert waiting.returncode == 1, err
    assert "run 1 is running (phase 2/2, cleanup pending) with 1 resource(s) live in the world" in err, err
    assert "no worker is alive: start `roadie worker` to carry it on" in err
    assert "`roadie run cancel 1` cancels it and cleans up" in err
    code, out = roadie("run", "show", "1", "--json")
    run = json.loads(out)["run"]
    assert run["status"] == "running"
    assert all(s["status"] != "running" for s in json.loads(out)["steps"])  # nothing left claimed mid-flight
    code, out = roadie("run", "cancel", "1")
    assert (code, out.strip()) == (0, "run 1: cancel requested")
    code, out = roadie("run", "cancel", "1")
    assert (code, out.strip()) == (0, "run 1: cancel already requested")


WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"planted-webhook-key-0123456789ab").decode()
MODULE_SECRET = "planted-secret-of-a-pull-module"


def test_no_command_prints_a_secret_of_its_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database: Database
) -> None:
    """The database password (planted in every PostgreSQL URL of the suite), a webhook's
    signing secret and a module's shared secret, given as an operator gives them, appear
    in no output of any command, errors and logs included (debug logging on)."""
    monkeypatch.chdir(tmp_path)
    url = database.fresh(tmp_path)
    monkeypatch.delenv("ROADIE_DATABASE_URL", raising=False)
    monkeypatch.delenv("ROADIE_CONFIG", raising=False)
    (tmp_path / "roadie.toml").write_text(
        f'database_url = "{url}"\n'
        f'[modules.faraway]\ntransport = "pull"\nsecret = "{MODULE_SECRET}"\n'
        f'[[webhooks]]\nname = "ops"\nurl = "http://127.0.0.1:1/hook"\nformat = "json"\n'
        f'secret = "{WEBHOOK_SECRET}"\n'
    )
    (tmp_path / "quick.yaml").write_text(QUICK_EVENT)
    commands = [
        (["init"], 0),
        (["init", "--json"], 0),
        (["event", "validate", "quick.yaml"], 0),
        (["event", "apply", "quick.yaml"], 0),
        (["event", "list"], 0),
        (["run", "start", "quick-raid", "--wait"], 0),
        (["run", "list"], 0),
        (["run", "show", "1", "--json"], 0),
        (["cleanup", "1", "--plan"], 0),
        (["leases"], 0),
        (["audit"], 0),
        (["workers"], 0),
        (["webhooks", "list"], 0),
        (["webhooks", "test", "ops"], 1),  # nothing listens there: the error names the URL
        (["run", "show", "99"], 66),
        (["sandbox", "show"], 0),
    ]
    if database.backend == "postgresql":  # a database that does not exist, on a server that does
        commands.append((["run", "list", "--database-url", url.rsplit("/", 1)[0] + "/no_such_db"], 69))
    try:
        for command, code in commands:
            result = runner.invoke(app, ["--log-level", "debug", *command])
            printed = result.output
            assert result.exit_code == code, f"roadie {' '.join(command)}: {printed}"
            for secret in (WEBHOOK_SECRET, MODULE_SECRET, PLANTED_PASSWORD):
                assert secret not in printed, f"roadie {' '.join(command)} printed {secret!r}: {printed}"
    finally:
        database.drop_all()


@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_a_port_in_use_is_one_line(folder: Path, command: str) -> None:
    """Before: uvicorn's own log line and exit 1, after the database was opened and the
    worker announced. Now one line naming the address, exit 69."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = roadie(command, "--port", str(port))
    assert code == 69, out
    [line] = out.strip().splitlines()
    assert line.startswith(f"error cannot listen on 127.0.0.1:{port}: Address already in use"), line


def test_wait_exits_1_when_the_cleanup_is_held_as_roadie_cleanup_does(folder: Path) -> None:
    """Before: `run start --wait` exited 0 for a run that succeeded while its cleanup was
    held over a module's cap, with the world not restored, where `roadie cleanup` of the
    same run exits 1. Now it exits 1 too, and its help says so."""
    (folder / "roadie.toml").write_text('[engine.cleanup_caps]\nsandbox = 1\n[modules.sandbox]\ndb = "w.db"\n')
    (folder / "quick.yaml").write_text(QUICK_EVENT)
    code, out = roadie("run", "start", "quick.yaml", "--wait")
    assert "run 1 of 'quick-raid': succeeded, cleanup held" in out, out
    assert code == 1, out
    code, out = roadie("cleanup", "1")
    assert (code, "held" in out) == (1, True), out
    code, out = roadie("cleanup", "1", "--confirm")
    assert code == 0, out
    code, out = roadie("run", "start", "--help")
    assert "held" in " ".join(out.split()), out


def test_cleanup_verify_exits_1_when_something_came_back_and_says_so(folder: Path) -> None:
    """The world comes back from a save made before the cleanup: `cleanup --verify` finds
    what came back, reverts it again and exits 1 (the cleanup is rolled back, not
    complete); the next round reads it back clean and exits 0. Its help says so, as
    the docs do."""
    (folder / "roadie.toml").write_text('[modules.sandbox]\ndb = "w.db"\n')
    (folder / "manual.yaml").write_text(QUICK_EVENT.replace("cleanup: auto", "cleanup: manual"))
    code, out = roadie("run", "start", "manual.yaml", "--wait")
    assert code == 0, out
    save = folder / "save"
    save.mkdir()
    for file in folder.glob("w.db*"):
        shutil.copy(file, save / file.name)
    code, out = roadie("cleanup", "1")
    assert (code, "verified clean" in out) == (0, True), out
    for file in folder.glob("w.db*"):
        file.unlink()
    for file in save.iterdir():
        shutil.copy(file, folder / file.name)
    code, out = roadie("cleanup", "1", "--verify")
    assert (code, "came back" in out) == (1, True), out
    code, out = roadie("cleanup", "1")
    assert (code, "verified clean" in out) == (0, True), out
    code, out = roadie("cleanup", "--help")
    said = " ".join(out.split())
    assert "exit 1" in said, out
    assert "came back" in said, out


def test_database_url_and_config_are_taken_before_the_command_too(folder: Path) -> None:
    """Before: `roadie --database-url X run list` was 'No such option' (the options were
    the subcommands' only). Now they are taken before the command as well, for it, and a
    command's own wins; --help lists them."""
    first, second = folder / "first.db", folder / "second.db"
    code, out = roadie("--database-url", f"sqlite:///{first}", "init")
    assert code == 0, out
    assert first.exists()
    code, out = roadie("--database-url", f"sqlite:///{first}", "run", "list", "--json")
    assert (code, out.strip(), "no database here yet" in out) == (0, "[]", False), out
    code, out = roadie("--database-url", f"sqlite:///{first}", "init", "--database-url", f"sqlite:///{second}")
    assert (code, second.exists()) == (0, True), out
    (folder / "conf.toml").write_text(f'database_url = "sqlite:///{folder / "third.db"}"\n')
    code, out = roadie("--config", "conf.toml", "init")
    assert (code, (folder / "third.db").exists()) == (0, True), out
    code, out = roadie("--config", "missing.toml", "run", "list")
    assert (code, "missing.toml: no such configuration file" in out) == (78, True), out
    code, out = roadie("--help")
    assert "--database-url" in out
    assert "--config" in out


NO_DEFAULT_EVENT = """\
id: doubled
params:
  n: {type: int}
phases:
  - name: only
    steps:
      - action: sandbox.broadcast
        with: {message: "{{ n * 2 }} orcs"}
"""


def test_a_param_without_a_default_must_be_given(folder: Path) -> None:
    """Before: a param with no default and not `required` was None when not given, and the
    run failed in its template with `TypeError: unsupported operand type(s) for *:
    'NoneType' and 'int'`, naming no param. Now a param without a default must be given:
    the start is refused before a run exists, naming it (and a schedule that does not
    give it is refused when the file is checked)."""
    (folder / "doubled.yaml").write_text(NO_DEFAULT_EVENT)
    code, out = roadie("run", "start", "doubled.yaml", "--wait")
    assert code == 65, out
    assert "param 'n' is required: it has no default" in out
    code, out = roadie("run", "list", "--json")
    assert json.loads(out) == []
    code, out = roadie("run", "start", "doubled", "-p", "n=3", "--wait")
    assert code == 0, out
    scheduled = NO_DEFAULT_EVENT.replace("phases:", "schedule: {at: ['2031-01-01T00:00:00Z']}\nphases:", 1)
    (folder / "scheduled.yaml").write_text(scheduled)
    code, out = roadie("event", "validate", "scheduled.yaml")
    assert code == 65, out
    assert "param 'n' is required: it has no default" in out


WAVES_EVENT = """\
id: waves
cleanup: auto
params:
  waves: {type: list, default: [1]}
phases:
  - name: announce
    steps:
      - action: sandbox.broadcast
        with: {message: "waves {{ waves }}"}
"""


def test_a_param_given_twice_is_refused_naming_it(folder: Path) -> None:
    """Before: `-p count=3 -p count=5` ran with count 5, the 3 dropped without a word. Now
    it is a usage error (exit 2, as any bad command line), naming the param and both
    values, before anything is stored; a list param too, whose items are one JSON value,
    which is said in the same line."""
    (folder / "quick.yaml").write_text(QUICK_EVENT)
    (folder / "waves.yaml").write_text(WAVES_EVENT)
    code, out = roadie("run", "start", "quick.yaml", "-p", "count=3", "-p", "count=5")
    assert code == 2, out
    [said] = [line for line in out.splitlines() if "given twice" in line]
    assert "'count' given twice (count=3, count=5): give it once" in said, out
    code, out = roadie("run", "start", "waves.yaml", "-p", "waves=3", "--param", "waves=5")
    assert code == 2, out
    assert "'waves' given twice (waves=3, waves=5): give it once; a list is one JSON value, waves='[...]'" in out
    code, out = roadie("run", "start", "waves.yaml", "-p", "waves=[3, 5]", "--json")
    assert code == 0, out
    run = json.loads(out)
    assert (run["id"], run["params"]) == (1, {"waves": [3, 5]})  # the first run: the refused made none


HOLD_YEW = """\
id: storm-yew
cleanup: manual
phases:
  - name: storm
    steps:
      - action: core.lease
        with: {lease: sandbox.weather, target: yew, value: storm}
"""

WEEKEND = """\
id: weekend
cleanup: auto
phases:
  - name: announce
    steps:
      - action: sandbox.broadcast
        with: {message: "Double XP weekend has begun in Yew!"}
  - name: sky
    steps:
      - action: core.lease
        with: {lease: sandbox.weather, target: yew, value: clear}
"""


def test_run_start_refuses_a_run_whose_setting_is_held_and_force_overrides_it(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `run start` started a run bound to fail at its borrow, after its broadcast
    had gone to every player. Now it exits 75 with one line naming the holder, storing and
    sending nothing; `--force` starts it, and `roadie audit` shows who overrode what."""
    monkeypatch.setenv("USER", "alice")
    (folder / "storm.yaml").write_text(HOLD_YEW)
    (folder / "weekend.yaml").write_text(WEEKEND)
    code, out = roadie("run", "start", "storm.yaml", "--wait")
    assert code == 0, out
    code, out = roadie("run", "start", "weekend.yaml", "--wait")
    assert code == 75, out
    [message] = out.strip().splitlines()
    assert message.startswith("error run not started (nothing was sent): "), message
    assert "sandbox.weather#yew is held by run 1 (started by alice) until its cleanup" in message
    assert "--force starts it anyway" in message
    code, out = roadie("run", "list", "--json")
    assert [r["id"] for r in json.loads(out)] == [1]
    code, out = roadie("sandbox", "show", "--json")
    assert "Double XP" not in out
    code, out = roadie("run", "start", "weekend", "--force", "--wait")
    assert code == 1, out  # forced past pre-flight, the ledger still refuses the borrow
    code, out = roadie("audit", "--action", "run.force", "--json")
    [entry] = json.loads(out)
    assert (entry["actor"], entry["subject"]) == ("alice", "run:2")
    assert entry["detail"]["overridden"][0]["held_by"] == 1
