"""`roadie conformance`: a table per rule, JSON for scripts, exit 1 on any failure."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from typer.testing import CliRunner

from roadie import protocol
from roadie.cli.main import app
from roadie.conformance import RULE_NAMES
from tests.conformance.servers import SECRET, Broken, sandbox_server

runner = CliRunner()


@contextmanager
def listening(make_app: Any, home: Path) -> Iterator[str]:
    """Serve `make_app(server)` with uvicorn on loopback, in a thread, for the test's duration."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = sandbox_server(home)
    web = uvicorn.Server(uvicorn.Config(make_app(server), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not web.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        web.should_exit = True
        thread.join(10)


def test_conforming_server_prints_a_table_and_exits_0(tmp_path: Path) -> None:
    with listening(lambda server: server.app(), tmp_path) as url:
        result = runner.invoke(
            app,
            [
                "conformance",
                url,
                "--secret",
                SECRET,
                "--target",
                "weather=britain",
                "--params",
                'spawn={"kind": "orc", "region": "yew"}',
            ],
        )
    assert result.exit_code == 0, result.output
    for rule in RULE_NAMES:
        assert rule in result.output
    assert "conforms" in result.output
    assert "FAIL" not in result.output


def test_broken_server_exits_1_naming_the_rule_in_json(tmp_path: Path) -> None:
    with listening(lambda server: Broken(server, ["revert_key_noop"]), tmp_path) as url:
        result = runner.invoke(app, ["conformance", url, "--json"], env={"ROADIE_CONFORMANCE_SECRET": SECRET})
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    failed = [r["rule"] for r in report["results"] if r["outcome"] == "fail"]
    assert failed == ["revert_by_key"]
    assert report["ok"] is False
    assert {r["rule"]: r["outcome"] for r in report["results"]}[
        "lease_restore"
    ] == "pass"  # weather skipped, xp_rate run


def test_bad_arguments_are_refused_before_anything_is_sent() -> None:
    result = runner.invoke(app, ["conformance", "http://127.0.0.1:9", "--secret", "s", "--params", "spawn={nope"])
    assert result.exit_code == 2
    assert "not JSON" in result.output
    result = runner.invoke(app, ["conformance", "http://127.0.0.1:9", "--secret", "s", "--rule", "no_such_rule"])
    assert result.exit_code == 2
    assert "no such rule" in result.output


def test_roadie_secret_prints_a_new_standard_webhooks_secret() -> None:
    printed = [CliRunner().invoke(app, ["secret"]) for _ in range(2)]
    assert [p.exit_code for p in printed] == [0, 0]
    first, second = (p.output.strip() for p in printed)
    assert first.startswith("whsec_")
    assert first != second
    assert len(protocol.secret_bytes(first)) == 32


def test_pull_with_no_module_gives_up_after_the_timeout_given() -> None:
    """Before: `--pull --timeout 10` with no module polling ran for 141 s (the module's
    announcement was awaited 60 s, whatever --timeout said, then again by every retry
    until the rule's own limit). Now it waits --timeout seconds once, and every rule
    says no module announced itself."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    started = time.monotonic()
    result = runner.invoke(
        app, ["conformance", "--pull", f"http://127.0.0.1:{port}", "--secret", SECRET, "--timeout", "2", "--json"]
    )
    took = time.monotonic() - started
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert "no module announced itself within 2s" in result.stdout
    assert took < 30, f"{took:.0f} s with --timeout 2"  # it was 141 s when the timeout was ignored
    assert "announce" in " ".join(runner.invoke(app, ["conformance", "--help"]).output.split())
