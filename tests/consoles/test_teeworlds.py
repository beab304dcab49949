"""Teeworlds 0.7, a real server reached only by its external console (econ, TCP), as a
Roadie world described by the shipped definition (integrations/teeworlds/teeworlds.yaml):
settings borrowed and given back exactly, the console found again after the server is
killed and restarted, and no event parameter able to send a second command."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from roadie.consoles.econ import TeeworldsEcon
from roadie.consoles.transport import ConsoleError
from roadie.web import WebOptions, create_app
from tests.consoles.servers import PASSWORD, TEEWORLDS, Project, Teeworlds, bindable, require, wait_for
from tests.web.conftest import mint_tokens

DEFINITION = "integrations/teeworlds/teeworlds.yaml"
pytestmark = pytest.mark.timeout(400)

EVENT = """
id: frenzy
title: Score frenzy
cleanup: {cleanup}
phases:
  - name: setup
    steps:
      - {{action: core.lease, with: {{lease: tee.motd, value: "Frenzy weekend; first to 5 wins"}}}}
      - action: core.lease
        with: {{lease: tee.scorelimit, value: 5}}
        retry: {{attempts: 100, backoff: 0.5, max_backoff: 2}}
      - action: tee.broadcast
        with: {{message: "Frenzy! First to 5 wins"}}
        retry: {{attempts: 100, backoff: 0.5, max_backoff: 2}}
  - name: later
    after: {after}
    steps:
      - action: core.lease
        with: {{lease: tee.timelimit, value: 3}}
        retry: {{attempts: 100, backoff: 0.5, max_backoff: 2}}
"""


@pytest.fixture
def tee(tmp_path: Path) -> Iterator[Teeworlds]:
    require(TEEWORLDS, "teeworlds-server")
    server = Teeworlds(tmp_path / "teeworlds")
    try:
        server.start()
        yield server
    except BaseException:
        print("--- teeworlds log ---\n" + server.log_tail())
        raise
    finally:
        server.stop()


def _world(tee: Teeworlds) -> dict[str, str]:
    return {name: tee.setting(name) for name in ("sv_motd", "sv_scorelimit", "sv_timelimit", "sv_name")}


def test_settings_are_borrowed_over_econ_and_cleanup_gives_each_back_exactly(tee: Teeworlds, tmp_path: Path) -> None:
    project = Project(tmp_path / "roadie", "tee", DEFINITION, f"127.0.0.1:{tee.econ_port}")
    before = _world(tee)
    assert before["sv_motd"] == "welcome"
    (project.home / "frenzy.yaml").write_text(EVENT.format(cleanup="manual", after="0s"))

    run_id = project.json("run", "start", "frenzy.yaml", "--wait")["id"]
    assert project.show(run_id)["run"]["status"] == "succeeded"
    during = _world(tee)
    # The `;` inside the value is part of the message, not a second command.
    assert during["sv_motd"] == "Frenzy weekend; first to 5 wins"
    assert (during["sv_scorelimit"], during["sv_timelimit"], during["sv_name"]) == ("5", "3", before["sv_name"])

    report = project.json("cleanup", str(run_id))
    assert (report["status"], report["verdict"], report["restored"]) == ("complete", "verified_clean", 3), report
    assert _world(tee) == before


def test_a_teeworlds_server_killed_mid_event_is_reached_again_and_cleanup_ends_exact(
    tee: Teeworlds, tmp_path: Path
) -> None:
    """Teeworlds keeps its settings in memory: a SIGKILL loses the borrowed ones, and the
    restarted server reads its command line again (and has no econ until the kernel frees
    the dead server's port). The console's connection is opened again; the steps the kill
    may meet (the setup's last two, the later phase) are retried until they can be; cleanup
    writes only what is not back already. The worker's look at a run's borrows is off here,
    so that the restart's loss is what cleanup meets (the next test is that look)."""
    project = Project(tmp_path / "roadie", "tee", DEFINITION, f"127.0.0.1:{tee.econ_port}", keep_interval=0)
    before = _world(tee)
    (project.home / "frenzy.yaml").write_text(EVENT.format(cleanup="auto", after="4s"))
    applied = project.run("event", "apply", "frenzy.yaml")
    assert applied.returncode == 0, applied.stderr
    run_id = project.json("run", "start", "frenzy")["id"]
    project.start_worker()
    try:
        wait_for("the setup phase", lambda: tee.setting("sv_scorelimit") == "5", 60, every=0.3)
        tee.kill()
        tee.start()
        # What the restart forgot: the setup phase's settings (the next phase may already
        # have borrowed its own again by now).
        assert (tee.setting("sv_motd"), tee.setting("sv_scorelimit")) == (before["sv_motd"], before["sv_scorelimit"])
        project.wait_cleaned_up(run_id, 240)
    finally:
        project.stop_worker()
    shown = project.show(run_id)
    assert (shown["run"]["status"], shown["run"]["cleanup_status"]) == ("succeeded", "complete"), shown
    assert _world(tee) == before


def test_a_restarted_teeworlds_server_gets_the_runs_borrows_back_while_the_run_goes_on(
    tee: Teeworlds, tmp_path: Path
) -> None:
    """Issue 37 item 4 on a console: the server knows nothing of Roadie and announces
    nothing, so the worker's regular look finds the restart: each borrow the world shows at
    its value from before is put back, and the run's audit says so."""
    project = Project(tmp_path / "roadie", "tee", DEFINITION, f"127.0.0.1:{tee.econ_port}", keep_interval=1)
    before = _world(tee)
    (project.home / "frenzy.yaml").write_text(EVENT.format(cleanup="auto", after="1h"))
    run_id = project.json("run", "start", "frenzy.yaml")["id"]
    project.start_worker()
    try:

        def set_up() -> bool:  # (a run's steps are made by the worker: none at first)
            first = [s["status"] for s in project.show(run_id)["steps"] if s["phase"] == 0]
            return first == ["succeeded"] * 3

        # The whole phase, not only what the world shows: a borrow whose answer the kill
        # lost is retried after the restart, and sets the value again by itself.
        wait_for("the setup phase", set_up, 60, every=0.3)
        tee.kill()
        tee.start()

        def reapplied() -> list[str] | None:
            entries = project.json("audit", "--run", str(run_id), "--action", "world")
            refs = sorted(str((e["detail"] or {}).get("ref", "")) for e in entries if e["action"] == "world.reapplied")
            return refs if len(refs) >= 2 else None

        try:
            refs = wait_for("the worker to put both borrows back", reapplied, 120, every=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{project.worker_said()}\n--- server log ---\n{tee.log_tail()}") from None
        assert refs == ["tee.motd", "tee.scorelimit"], refs
        assert (tee.setting("sv_motd"), tee.setting("sv_scorelimit")) == ("Frenzy weekend; first to 5 wins", "5")
        assert project.show(run_id)["run"]["status"] == "running"
        assert project.run("run", "cancel", str(run_id)).returncode == 0
        project.wait_cleaned_up(run_id, 120)
    finally:
        project.stop_worker()
    assert project.show(run_id)["run"]["cleanup_status"] == "complete"
    assert _world(tee) == before


def test_no_event_parameter_can_send_teeworlds_a_second_command(tee: Teeworlds, tmp_path: Path) -> None:
    project = Project(tmp_path / "roadie", "tee", DEFINITION, f"127.0.0.1:{tee.econ_port}")
    before = _world(tee)
    for value in ['x"; sv_name pwned; "', "x\nsv_name pwned", 'x\\"; sv_name pwned #']:
        (project.home / "bad.yaml").write_text(
            "id: bad\ntitle: bad\nphases:\n  - name: one\n    steps:\n"
            f"      - {{action: core.lease, with: {{lease: tee.motd, value: {json.dumps(value)}}}}}\n"
            f"      - {{action: tee.say, with: {{message: {json.dumps(value)}}}}}\n"
        )
        done = project.run("event", "validate", "bad.yaml")
        assert done.returncode != 0, (value, done.stdout)
        said = done.stdout + done.stderr
        assert "with.value" in said, said
        assert "with.message" in said, said
    assert _world(tee) == before


def test_conformance_checks_the_teeworlds_module_against_the_live_server(tee: Teeworlds, tmp_path: Path) -> None:
    project = Project(tmp_path / "roadie", "tee", DEFINITION, f"127.0.0.1:{tee.econ_port}")
    before = _world(tee)
    report = project.json("conformance", "--module", "tee", "--params", 'say={"message": "conformance"}')
    assert report["ok"], report
    outcomes = {r["rule"]: r["outcome"] for r in report["results"]}
    assert all(outcomes[f"lease tee.{n}"] == "pass" for n in ("motd", "name", "scorelimit", "timelimit"))
    assert outcomes["action tee.say"] == "pass"
    assert outcomes["action tee.broadcast"] == "skip"
    assert _world(tee) == before


def test_a_wrong_econ_password_is_one_line_that_says_so(tee: Teeworlds, tmp_path: Path) -> None:
    project = Project(tmp_path / "roadie", "tee", DEFINITION, f"127.0.0.1:{tee.econ_port}")
    project.env["ROADIE_CONSOLE_TEE"] = "not-the-password"
    report = project.json("conformance", "--module", "tee", exit_code=1)
    details = [r["detail"] for r in report["results"] if r["outcome"] == "fail"]
    assert details, report
    assert all("Wrong password" in d for d in details), details


def test_the_website_catalogue_shows_a_console_world(
    tee: Teeworlds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = Project(tmp_path / "roadie", "tee", DEFINITION, f"127.0.0.1:{tee.econ_port}")
    monkeypatch.setenv("ROADIE_CONSOLE_TEE", project.env["ROADIE_CONSOLE_TEE"])
    url = f"sqlite:///{project.home / 'roadie.db'}"
    assert project.run("init").returncode == 0
    token = mint_tokens(url, "viewer")["viewer"]
    app = create_app(WebOptions(database_url=url, config=str(project.home / "roadie.toml"), worker=False))
    with TestClient(app) as client:
        headers = {"Authorization": f"Bearer {token}"}
        listed = {m["name"]: m for m in client.get("/api/v1/catalogue", headers=headers).json()}
        assert {a["id"] for a in listed["tee"]["actions"]} == {"tee.broadcast", "tee.say"}
        assert "tee.motd" in {lease["id"] for lease in listed["tee"]["leases"]}
        page = client.get("/catalogue", headers=headers)
        assert page.status_code == 200
        assert "tee.scorelimit" in page.text


def test_a_run_is_not_started_against_a_console_that_does_not_answer(tee: Teeworlds, tmp_path: Path) -> None:
    """Pre-flight asks the console before any step is sent: with the server down, the
    start is refused, naming the module, and no run is made."""
    project = Project(tmp_path / "roadie", "tee", DEFINITION, f"127.0.0.1:{tee.econ_port}")
    (project.home / "frenzy.yaml").write_text(EVENT.format(cleanup="auto", after="0s"))
    tee.stop()
    refused = project.run("run", "start", "frenzy.yaml")
    assert refused.returncode == 75, refused.stdout + refused.stderr
    assert "module tee is offline: its console does not answer" in refused.stdout + refused.stderr
    assert project.json("run", "list") == []


def test_another_econ_client_s_output_is_never_read_as_roadie_s_reply(tee: Teeworlds) -> None:
    """Every econ client hears every command's output. While another client (an admin's
    session) reads sv_scorelimit again and again, each of Roadie's reads of sv_motd is
    sv_motd's, never the other's `Value: 20`."""
    stop = threading.Event()

    def admin() -> None:
        while not stop.is_set():
            tee.econ(["sv_scorelimit"] * 5)

    other = threading.Thread(target=admin, daemon=True)
    other.start()

    async def reads() -> list[str]:
        console = TeeworldsEcon("127.0.0.1", tee.econ_port, PASSWORD)
        try:
            return [await console.send("sv_motd") for _ in range(40)]
        finally:
            await console.close()

    try:
        got = asyncio.run(reads())
    finally:
        stop.set()
        other.join(30)
    assert got == ["Value: welcome"] * 40, sorted(set(got))


def test_roadie_leaving_econ_never_kills_the_server(tee: Teeworlds) -> None:
    """Teeworlds 0.7 does not ignore SIGPIPE: a client that hangs up while the server is
    writing everyone's output may be sent one more line, and the server dies of it (a plain
    close here killed it within a hundred leaves in most tries). Roadie closes its half of
    the connection and reads on until the server closes the other: a hundred leaves while
    an admin's session keeps the server talking, and the server is still there."""
    stop = threading.Event()
    session = socket.create_connection(("127.0.0.1", tee.econ_port), timeout=30)
    lines = session.makefile("rb")
    while b"password" not in lines.readline().lower():
        pass
    session.sendall(PASSWORD.encode() + b"\n")
    assert b"successful" in lines.readline()

    def hear() -> None:  # everyone's output, until the server closes the session
        while lines.readline():
            pass

    hearing = threading.Thread(target=hear, daemon=True)
    hearing.start()

    def talk() -> None:
        with contextlib.suppress(OSError):  # a server that died: said below, with its log
            while not stop.is_set():
                session.sendall(b"sv_scorelimit\n" * 20)

    talking = threading.Thread(target=talk, daemon=True)
    talking.start()

    async def leaves() -> None:
        for _ in range(100):
            console = TeeworldsEcon("127.0.0.1", tee.econ_port, PASSWORD)
            assert await console.send("sv_motd") == "Value: welcome"
            await console.close()

    try:
        asyncio.run(leaves())
    except ConsoleError:
        tee.alive()  # a server that died says so, with its log
        raise
    finally:
        stop.set()
        talking.join(30)
    tee.alive()
    session.shutdown(socket.SHUT_WR)
    hearing.join(30)
    session.close()
    assert not hearing.is_alive()


def test_roadie_leaving_econ_leaves_the_port_free_for_a_restart(tee: Teeworlds) -> None:
    """Teeworlds binds its econ port without SO_REUSEADDR, so a connection the server
    closed first holds the port in TIME_WAIT for a minute, and a server restarted in it has
    no econ. Roadie closes first (its half, then hears the server out): after it leaves,
    the port is free the moment the server is gone. (Leaving by `logout` held it 61 s.)"""

    async def leave() -> str:
        console = TeeworldsEcon("127.0.0.1", tee.econ_port, PASSWORD)
        try:
            return await console.send("sv_motd")
        finally:
            await console.close()

    assert asyncio.run(leave()) == "Value: welcome"
    tee.kill()
    wait_for("the econ port to be free", lambda: bindable(tee.econ_port), 10, every=0.2)
