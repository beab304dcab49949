"""The command line, as an operator uses it: each command run in a fresh directory."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from roadie.cli.main import app
from tests.databases import Database

runner = CliRunner()

QUICK_EVENT = """\
id: quick-raid
title: A quick raid
params:
  region: {type: str, default: yew}
  count: {type: int, default: 2, min: 1}
cleanup: auto
phases:
  - name: omen
    steps:
      - action: core.lease
        with: {lease: sandbox.weather, target: "{{ region }}", value: fog}
      - action: sandbox.broadcast
        with: {message: "Raiders near {{ region }}"}
  - name: raid
    steps:
      - action: sandbox.spawn
        name: raiders
        with: {kind: raider, region: "{{ region }}", count: "{{ count }}"}
"""

MANUAL_EVENT = QUICK_EVENT.replace("id: quick-raid", "id: manual-raid").replace("cleanup: auto", "cleanup: manual")


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database: Database) -> Iterator[Path]:
    """A fresh directory, with `ROADIE_DATABASE_URL` naming a fresh database of this
    test's backend."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROADIE_DATABASE_URL", database.fresh(tmp_path))
    monkeypatch.delenv("ROADIE_CONFIG", raising=False)
    (tmp_path / "quick.yaml").write_text(QUICK_EVENT)
    (tmp_path / "manual.yaml").write_text(MANUAL_EVENT)
    yield tmp_path
    database.drop_all()


def roadie(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def test_validate_accepts_a_good_file_and_names_field_and_line_of_a_bad_one(workdir: Path) -> None:
    """`event validate` says ok for a good file; for a misspelled action it exits 65 (bad
    data) with `file:line: field: message (did you mean ...)`."""
    code, out = roadie("event", "validate", "quick.yaml")
    assert code == 0, out
    assert "ok" in out
    (workdir / "bad.yaml").write_text(QUICK_EVENT.replace("sandbox.spawn", "sandbox.spwan"))
    code, out = roadie("event", "validate", "bad.yaml")
    assert code == 65
    expected = "bad.yaml:16: phases[1].steps[0].action: unknown action 'sandbox.spwan' (did you mean 'sandbox.spawn'?)"
    assert expected in out


def test_validate_and_apply_answer_json_for_scripts(workdir: Path) -> None:
    """`event validate --json` and `event apply --json`: what they found, or the problems
    with their lines, as JSON (they had no --json)."""
    code, out = roadie("event", "validate", "quick.yaml", "--json")
    assert code == 0, out
    checked = json.loads(out)
    assert (checked["ok"], checked["file"], checked["steps"]) == (True, "quick.yaml", 3), checked
    (workdir / "bad.yaml").write_text(QUICK_EVENT.replace("sandbox.spawn", "sandbox.spwan"))
    code, out = roadie("event", "validate", "bad.yaml", "--json")
    assert code == 65
    error = json.loads(out)["error"]
    assert error["kind"] == "definition"
    assert any("bad.yaml:16: phases[1].steps[0].action" in m for m in error["messages"]), error
    code, out = roadie("event", "apply", "quick.yaml", "--json")
    assert code == 0, out
    assert json.loads(out)["version"] == 1


def test_init_cancel_and_forget_answer_json_for_scripts(workdir: Path) -> None:
    """`init --json`, `run cancel --json` and `forget --json` print what they did as one
    JSON object, and an error as the JSON error with the exit code it has without --json
    (they had no --json)."""
    code, out = roadie("init", "--json")
    assert code == 0, out
    assert set(json.loads(out)) == {"database_url", "schema"}
    code, out = roadie("run", "start", "manual.yaml", "--json")
    assert code == 0, out
    in_flight = json.loads(out)["id"]
    code, out = roadie("run", "cancel", str(in_flight), "--json")
    assert (code, json.loads(out)) == (0, {"run_id": in_flight, "cancel_requested": True, "already_requested": False})
    code, out = roadie("run", "cancel", str(in_flight), "--json")
    assert (code, json.loads(out)["already_requested"]) == (0, True)
    code, out = roadie("run", "start", "manual.yaml", "--wait", "--json")
    ended = json.loads(out)["id"]
    for command, exit_code, kind, says in (
        (["run", "cancel", str(ended)], 1, "invalid_state", f"run {ended} has already ended (succeeded)"),
        (["run", "cancel", "42"], 66, "not_found", "no run 42"),
        (["forget", "4242", "--reason", "gone"], 66, "not_found", "4242"),
    ):
        code, out = roadie(*command, "--json")
        error = json.loads(out)["error"]
        assert (code, error["exit_code"], error["kind"]) == (exit_code, exit_code, kind), out
        assert says in error["messages"][0], out
        assert roadie(*command)[0] == exit_code
    code, out = roadie("run", "show", str(ended), "--json")
    creature = next(r for r in json.loads(out)["resources"] if r["kind"] == "creature")
    code, out = roadie("forget", str(creature["id"]), "--reason", "the shard was wiped", "--json")
    assert code == 0, out
    forgotten = json.loads(out)
    assert (forgotten["id"], forgotten["state"], forgotten["run_id"]) == (creature["id"], "abandoned", ended)


def test_a_yaml_mistake_is_said_in_words_at_its_line(workdir: Path) -> None:
    """An indentation slip is said as the mistake it is, at its line, with its field, not
    in the parser's words ("expected <block end>, but found '<block mapping start>'")."""
    slipped = QUICK_EVENT.replace("        name: raiders", "       name: raiders")
    (workdir / "slipped.yaml").write_text(slipped)
    code, out = roadie("event", "validate", "slipped.yaml")
    assert code == 65
    assert "slipped.yaml:17: phases[1].steps[0].name: invalid YAML: this line is indented 7 spaces" in out
    assert "<block" not in out


def test_bad_step_parameters_are_refused_at_validation(workdir: Path) -> None:
    """A `with:` that does not fit the action's schema is refused before anything runs."""
    (workdir / "bad.yaml").write_text(QUICK_EVENT.replace('count: "{{ count }}"', "count: lots"))
    code, out = roadie("event", "validate", "bad.yaml")
    assert code == 65
    assert "phases[1].steps[0].with.count" in out


def test_a_run_with_wait_ends_cleaned_up_and_the_world_is_as_before(workdir: Path) -> None:
    """`run start FILE --wait` applies the event, works the run to its end and its
    automatic cleanup; `sandbox show --json` is the same before and after."""
    code, before = roadie("sandbox", "show", "--json")
    assert code == 0, before
    code, out = roadie("run", "start", "quick.yaml", "--param", "count=3", "--wait", "--json")
    assert code == 0, out
    run = json.loads(out)
    assert (run["status"], run["cleanup_status"]) == ("succeeded", "complete")
    assert run["params"] == {"region": "yew", "count": 3}
    code, after = roadie("sandbox", "show", "--json")
    assert json.loads(after) == json.loads(before)

    code, out = roadie("run", "show", str(run["id"]), "--json")
    shown = json.loads(out)
    assert [s["status"] for s in shown["steps"]] == ["succeeded"] * 3
    creatures = [r for r in shown["resources"] if r["kind"] == "creature"]
    assert len(creatures) == 3
    assert {r["state"] for r in creatures} == {"reverted"}
    code, out = roadie("run", "list", "--json")
    assert [r["id"] for r in json.loads(out)] == [run["id"]]


def test_manual_cleanup_plan_then_cleanup(workdir: Path) -> None:
    """With `cleanup: manual` the run ends dirty; `cleanup --plan` lists the calls and
    changes nothing; `cleanup` reverts them and reports complete."""
    code, out = roadie("run", "start", "manual.yaml", "--wait", "--json")
    assert code == 0, out
    run = json.loads(out)
    assert run["cleanup_status"] == "pending"
    code, world = roadie("sandbox", "show", "--json")
    assert len(json.loads(world)["creatures"]) == 2

    code, out = roadie("cleanup", str(run["id"]), "--plan", "--json")
    assert code == 0, out
    plan = json.loads(out)["calls"]
    assert [c["kind"] for c in plan] == ["revert", "restore"]
    assert len(plan[0]["resources"]) == 2
    summary = {(g["module"], g["kind"]): g for g in json.loads(out)["summary"]}
    assert summary["sandbox", "creature"]["count"] == 2
    assert summary["sandbox", "creature"]["newest"][0].startswith("raider in yew (creature ")
    assert summary["core", "override"]["newest"] == ["sandbox.weather#yew, back to 'clear'"]
    code, world_after_plan = roadie("sandbox", "show", "--json")
    assert world_after_plan == world
    code, out = roadie("run", "show", str(run["id"]))  # what it left, in the world's words
    assert "left in the world" in out
    assert "raider in yew (creature" in out
    code, out = roadie("run", "show", str(run["id"]), "--json")
    assert {(g["module"], g["kind"], g["count"]) for g in json.loads(out)["left_in_world"]} == {
        ("sandbox", "creature", 2),
        ("core", "override", 1),
    }

    code, out = roadie("cleanup", str(run["id"]), "--json")
    assert code == 0, out
    report = json.loads(out)
    assert (report["status"], report["reverted"], report["restored"]) == ("complete", 2, 1)
    code, world = roadie("sandbox", "show", "--json")
    assert json.loads(world)["creatures"] == {}
    assert json.loads(world)["regions"]["yew"] == "clear"


def test_a_bad_param_is_refused_before_a_run_exists(workdir: Path) -> None:
    """`--param count=0` below the declared minimum exits 65 naming the param; no run is made."""
    code, out = roadie("run", "start", "quick.yaml", "--param", "count=0")
    assert code == 65
    assert "param 'count' must be at least 1" in out
    code, out = roadie("run", "list", "--json")
    assert json.loads(out) == []


def test_unknown_run_is_a_clear_error(workdir: Path) -> None:
    """Asking for a run that does not exist exits 66 with a message, not a traceback;
    cancelling one says there is no such run (it said "not in flight")."""
    code, out = roadie("run", "show", "42")
    assert code == 66
    assert "no run 42" in out
    code, out = roadie("run", "cancel", "42")
    assert (code, out.strip()) == (66, "error no run 42")


def test_forget_is_audited_and_needs_a_reason(workdir: Path) -> None:
    """`forget RESOURCE --reason` marks a live row abandoned and writes the audit log."""
    code, out = roadie("run", "start", "manual.yaml", "--wait", "--json")
    run = json.loads(out)
    code, out = roadie("run", "show", str(run["id"]), "--json")
    creature = next(r for r in json.loads(out)["resources"] if r["kind"] == "creature")
    code, out = roadie("forget", str(creature["id"]), "--reason", "the shard was wiped", "--actor", "alice")
    assert code == 0, out
    code, out = roadie("audit", "--run", str(run["id"]), "--json")
    entries = json.loads(out)
    assert any(e["action"] == "resource.forget" and e["actor"] == "alice" for e in entries)
    code, out = roadie("audit", "--actor", "alice", "--action", "resource", "--json")
    assert [(e["action"], e["actor"]) for e in json.loads(out)] == [("resource.forget", "alice")]
    code, out = roadie("cleanup", str(run["id"]), "--json")
    report = json.loads(out)
    assert report["status"] == "complete"
    assert [f["resource"] for f in report["forgotten"]] == [creature["id"]]


def test_configuration_file_chooses_database_and_world(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`roadie.toml` sets the database URL and the sandbox's world file (when the
    environment does not say otherwise)."""
    monkeypatch.delenv("ROADIE_DATABASE_URL")
    (workdir / "roadie.toml").write_text('database_url = "sqlite:///other.db"\n[modules.sandbox]\ndb = "w.db"\n')
    code, out = roadie("init")
    assert code == 0, out
    assert "other.db" in out
    assert (workdir / "other.db").exists()
    code, out = roadie("sandbox", "show", "--json")
    assert (workdir / "w.db").exists()


def test_help_lists_the_commands(workdir: Path) -> None:
    """`--help` names every top-level command the README documents."""
    code, out = roadie("--help")
    assert code == 0
    for command in (
        "init",
        "event",
        "run",
        "cleanup",
        "forget",
        "leases",
        "audit",
        "actions",
        "worker",
        "sandbox",
        "demo",
    ):
        assert command in out


@pytest.mark.parametrize(
    ("url", "says", "exit_code"),
    [
        ("postgresql://nobody:planted-secret@127.0.0.1:1/x", "Connection refused", 69),
        ("mysql://root:planted-secret@127.0.0.1:1/x", "Can't connect", 69),
        ("postgresql://nobody@127.0.0.1:1/x?password=planted-secret", "Connection refused", 69),
        ("postgresql://nobody@127.0.0.1:1,127.0.0.1:2/x?password=planted-secret", "Connection refused", 69),
        ("mysql://root@127.0.0.1:1/x?password=planted-secret", "Can't connect", 69),
        ("postgresql://nobody@127.0.0.1:port/x?password=planted-secret", "is not a database URL", 78),
        ("sqlite:///{tmp}/no/such/folder/roadie.db", "/no/such/folder does not exist; create it", 69),
        ("bogus://planted-secret@x", "is no database Roadie can use", 78),
        ("not a url", "is not a database URL", 78),
    ],
)
def test_a_database_that_cannot_be_opened_is_one_line_saying_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, says: str, exit_code: int
) -> None:
    """Before: a 78 to 210 line traceback, after ten seconds of reconnecting for some.
    Now one line on the spot, naming the database (never its password) and what to check,
    for a run list, a worker and the web server alike; exit 69 for a database that cannot
    be opened, 78 for a URL that is wrong, and under --json the same as JSON."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ROADIE_CONFIG", raising=False)
    url = url.format(tmp=tmp_path)
    for command in (["run", "list"], ["worker"], ["serve", "--port", "1"]):
        code, output = roadie(*command, "--database-url", url)
        assert code == exit_code, output
        [line] = output.strip().splitlines()
        assert line.startswith("error "), line
        assert says in line, line
        assert "planted-secret" not in line
    code, output = roadie("run", "list", "--json", "--database-url", url)
    error = json.loads(output)["error"]
    assert (code, error["exit_code"], error["kind"]) == (exit_code, exit_code, "store" if exit_code == 69 else "config")
    [message] = error["messages"]
    assert says in message
    assert "planted-secret" not in output


def test_actions_lists_what_the_modules_offer(workdir: Path) -> None:
    """`roadie actions`: each action with its parameters and reversible class, each lease
    and how it is borrowed; `--json` adds each one's schema and an example step."""
    code, out = roadie("actions")
    assert code == 0, out
    assert "sandbox.spawn" in out
    assert "kind*: string" in out
    assert "per target, by one run at a time" in out
    # Each lease's row says what values it takes under "takes", and what it is after it.
    [row] = [line for line in out.splitlines() if "sandbox.xp_rate" in line]
    assert re.search(r"sandbox\.xp_rate .*│ number \(≥ 0\) +│ The world", row), row
    listed = runner.invoke(app, ["actions", "--json"])
    assert listed.exit_code == 0, listed.output
    modules = {m["name"]: m for m in json.loads(listed.stdout)}
    assert "sandbox.place_item" in {a["id"] for a in modules["sandbox"]["actions"]}
    assert all(a["example"].startswith(f"- action: {a['id']}") for a in modules["sandbox"]["actions"])
