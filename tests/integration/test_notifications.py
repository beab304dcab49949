"""Webhooks: a run started, ended or failed, a cleanup that left something behind, sent
to a real HTTP receiver, signed as Standard Webhooks says, retried, and sent once."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks import Webhook as Verifier
from tests.conftest import Harness
from typer.testing import CliRunner

from roadie.cli.main import app
from roadie.clock import SystemClock
from roadie.engine.notify import BACKOFF, Notifier, Webhook, describe, parse_webhooks
from roadie.errors import ConfigError

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

FAILING = """
id: raid
title: The orc raid
cleanup: auto
phases:
  - name: only
    steps:
      - action: sandbox.spawn
        name: orcs
        with: {kind: orc, region: britain, count: 2}
      - action: probe.make
        name: broken
        with: {error: permanent}
"""


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """A webhook receiver on a real socket, and keeps what it was sent. It answers a
    request with the first scripted answer whose text the body holds (using it up), else
    200: requests sent side by side arrive in any order."""

    url: str = ""
    got: list[Received] = field(default_factory=list)
    script: list[tuple[str, int, dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str]]:
        with self.lock:
            self.got.append(Received(headers, body))
            for entry in self.script:
                if entry[0].encode() in body:
                    self.script.remove(entry)
                    return entry[1], entry[2]
            return 200, {}

    def types(self) -> list[str]:
        return [r.json["type"] for r in self.got]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            status, extra = state.answer({k.lower(): v for k, v in self.headers.items()}, body)
            self.send_response(status)
            for name, value in extra.items():
                self.send_header(name, value)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_port}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def signed_by(secret: str, received: Received) -> bool:
    """The signature checked as a receiver would, at the time the request says it was sent."""
    headers = received.headers
    sent = datetime.fromtimestamp(int(headers["webhook-timestamp"]), tz=UTC)
    expected = Verifier(secret).sign(headers["webhook-id"], sent, received.body.decode())
    return expected in headers["webhook-signature"].split(" ")


def test_a_failed_run_and_its_cleanup_are_told_once_each_signed(harness: Harness, receiver: Receiver) -> None:
    """A run that starts, fails, and whose cleanup leaves orcs behind is told as three
    notifications, in order, each once, each signed; a second sender finds nothing."""
    harness.webhooks = [Webhook(name="ops", url=receiver.url, secret=SECRET)]
    harness.world.fail_reverts_next(1)

    async def body() -> None:
        await harness.restart()
        run = await harness.start(FAILING)
        [run] = await harness.settle(run)
        await harness.engine.notifications_sent()  # the worker's own send, beside the drain
        assert (run.status, run.cleanup_status) == ("failed", "incomplete")
        notifier = harness.engine.notifier
        assert notifier is not None
        while await notifier.deliver_due():
            pass
        assert receiver.types() == ["run.started", "run.failed", "cleanup.incomplete"]
        assert all(signed_by(SECRET, r) for r in receiver.got)
        assert len({r.headers["webhook-id"] for r in receiver.got}) == 3
        failed = receiver.got[1].json["data"]
        assert (failed["run"], failed["event"], failed["title"], failed["status"]) == (
            run.id,
            "raid",
            "The orc raid",
            "failed",
        )
        assert receiver.got[2].json["data"]["report"]["failed"] == 2
        other = Notifier(harness.store, harness.webhooks, harness.clock, incarnation="other")
        assert await other.deliver_due() == 0
        await other.close()
        states = [(d.kind, d.state, d.attempts) for d in reversed(await harness.store.list_deliveries(run.id))]
        assert states == [
            ("run.started", "delivered", 1),
            ("run.failed", "delivered", 1),
            ("cleanup.incomplete", "delivered", 1),
        ]

    harness.run(body)


def test_a_receiver_that_fails_is_tried_again_later_and_one_that_refuses_is_not(
    harness: Harness, receiver: Receiver
) -> None:
    """503 twice (the second with Retry-After) then 200: delivered on the third attempt,
    each after its pause and not before. A 400 is not tried again. A kind the webhook
    did not ask for is skipped without a request."""
    harness.webhooks = [Webhook(name="ops", url=receiver.url, format="slack", events=["run.started", "run.failed"])]
    receiver.script = [("started", 503, {}), ("failed", 503, {"retry-after": "120"})]

    async def body() -> None:
        await harness.restart()
        notifier = harness.engine.notifier
        assert notifier is not None
        run = await harness.start(FAILING)
        [run] = await harness.settle(run)
        await harness.engine.notifications_sent()  # the worker's own send, beside the drain
        start = harness.clock.now()
        assert await notifier.deliver_due() == 0  # run.started: 503; run.failed: 503 (Retry-After: 120)
        assert await notifier.deliver_due() == 0  # both wait
        harness.clock.set(start + timedelta(seconds=BACKOFF[0]))
        assert await notifier.deliver_due() == 1  # run.started; run.failed still waits out its 120 s
        harness.clock.set(start + timedelta(seconds=120))
        assert await notifier.deliver_due() == 1
        texts = [r.json["text"] for r in receiver.got]
        assert len(texts) == 4
        assert texts[-1].startswith("❌ Run 1 · The orc raid failed: ")
        rows = {d.kind: d for d in await harness.store.list_deliveries(run.id)}
        assert (rows["run.started"].state, rows["run.started"].attempts) == ("delivered", 2)
        assert (rows["run.failed"].state, rows["run.failed"].attempts) == ("delivered", 2)
        assert rows["cleanup.complete"].state == "skipped"

        receiver.script = [("started", 400, {})]
        second = await harness.start(FAILING.replace("id: raid", "id: raid2"))
        await harness.settle(second)
        await harness.engine.notifications_sent()  # the worker's own send, beside the drain
        harness.clock.set(harness.clock.now() + timedelta(hours=5))
        while await notifier.deliver_due():
            pass
        harness.clock.set(harness.clock.now() + timedelta(hours=5))
        await notifier.deliver_due()
        rows = {d.kind: d for d in await harness.store.list_deliveries(second.id)}
        assert rows["run.started"].state == "gave_up"
        assert rows["run.started"].last_error is not None
        assert rows["run.started"].last_error.startswith("HTTP 400")
        assert rows["run.started"].attempts == 1

    harness.run(body)


def test_one_sender_at_a_time_holds_a_webhook_so_its_messages_keep_their_order(harness: Harness) -> None:
    """While one sender holds a webhook, another takes none of its deliveries, though the
    first took only the oldest: the later ones cannot overtake it. Once it is given back
    the rest go in order; a holder that died is taken over when its claim runs out."""

    async def body() -> None:
        store, now = harness.store, harness.clock.now()
        await store.register_webhooks(["ops"], now)
        run = await harness.start(FAILING)
        await harness.settle(run)
        first = await store.claim_deliveries(["ops"], "a", now, 60, limit=1)
        assert [d.kind for d in first] == ["run.started"]
        assert await store.claim_deliveries(["ops"], "b", now, 60) == []
        assert await store.finish_delivery(first[0], "delivered", now)
        await store.release_webhooks("a")
        rest = await store.claim_deliveries(["ops"], "b", now, 60, limit=1)
        assert [d.kind for d in rest] == ["run.failed"]
        assert await store.claim_deliveries(["ops"], "c", now + timedelta(seconds=59), 60) == []
        later = await store.claim_deliveries(["ops"], "c", now + timedelta(seconds=61), 60)
        assert [d.kind for d in later] == ["run.failed", "cleanup.complete"]
        assert not await store.finish_delivery(rest[0], "delivered", now)  # b's claim is gone

    harness.run(body)


def test_a_webhook_added_later_is_not_sent_the_past(harness: Harness, receiver: Receiver) -> None:
    async def body() -> None:
        first = await harness.start(FAILING)
        await harness.settle(first)
        harness.webhooks = [Webhook(name="late", url=receiver.url)]
        await harness.restart()
        second = await harness.start(FAILING.replace("id: raid", "id: raid2"))
        await harness.settle(second)
        await harness.engine.notifications_sent()  # the worker's own send, beside the drain
        notifier = harness.engine.notifier
        assert notifier is not None
        while await notifier.deliver_due():
            pass
        assert {r.json["data"]["run"] for r in receiver.got} == {second.id}

    harness.run(body)


def test_the_signature_verifies_with_the_standard_library_at_real_time(harness: Harness, receiver: Receiver) -> None:
    """The Standard Webhooks reference library, checking the timestamp against the real
    clock as a receiver does, accepts what is sent; a tampered body is refused."""

    async def body() -> None:
        hook = Webhook(name="ops", url=receiver.url, format="discord", secret=SECRET)
        await harness.store.register_webhooks(["ops"], harness.clock.now())
        run = await harness.start(FAILING)
        await harness.settle(run)
        notifier = Notifier(harness.store, [hook], SystemClock(), incarnation="real")
        assert await notifier.deliver_due() == 3
        await notifier.close()
        sent = receiver.got[0]
        payload = Verifier(SECRET).verify(sent.body, sent.headers)
        assert payload["allowed_mentions"] == {"parse": []}
        assert "Run 1 · The orc raid started" in payload["content"]
        with pytest.raises(Exception, match="signature"):
            Verifier(SECRET).verify(sent.body.replace(b"started", b"stopped"), sent.headers)

    harness.run(body)


def test_a_bad_webhook_table_names_its_field() -> None:
    with pytest.raises(ConfigError, match=r"roadie.toml: webhooks\[1\].url"):
        parse_webhooks([{"name": "a", "url": "https://x/y"}, {"name": "b", "url": "discord"}], "roadie.toml")
    with pytest.raises(ConfigError, match=r"webhooks\[0\].secret: .*whsec_"):
        parse_webhooks([{"name": "a", "url": "https://x/y", "secret": "hunter2!"}], "roadie.toml")
    with pytest.raises(ConfigError, match="share a name"):
        parse_webhooks([{"name": "a", "url": "https://x/y"}, {"name": "a", "url": "https://x/z"}], "roadie.toml")


def test_the_cli_sends_a_test_message_and_lists_deliveries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, receiver: Receiver
) -> None:
    """`roadie webhooks test NAME` sends a signed message and prints the answer; a name
    not in roadie.toml, or a receiver that fails, exits 1 saying so."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROADIE_DATABASE_URL", f"sqlite:///{tmp_path / 'roadie.db'}")
    monkeypatch.delenv("ROADIE_CONFIG", raising=False)
    (tmp_path / "roadie.toml").write_text(
        f'[[webhooks]]\nname = "ops"\nurl = "{receiver.url}"\nformat = "slack"\nsecret = "{SECRET}"\n'
    )
    runner = CliRunner()
    sent = runner.invoke(app, ["webhooks", "test", "ops"])
    assert (sent.exit_code, sent.output.strip()) == (0, "ops: HTTP 200 ok")
    [got] = receiver.got
    assert signed_by(SECRET, got)
    assert "Roadie can reach this channel" in got.json["text"]
    unknown = runner.invoke(app, ["webhooks", "test", "nope"])
    assert unknown.exit_code == 1
    assert "no webhook named 'nope'" in unknown.output
    receiver.script = [("reach", 500, {})]
    failing = runner.invoke(app, ["webhooks", "test", "ops"])
    assert (failing.exit_code, "HTTP 500" in failing.output) == (1, True)
    listed = runner.invoke(app, ["webhooks", "list"])
    assert (listed.exit_code, listed.output.strip()) == (0, "nothing sent yet")


def test_a_chat_line_says_what_happened_to_a_running_runs_setup() -> None:
    """`run.world` (issue 37, item 4) in the words a chat channel reads."""
    run = {"run": 7, "title": "Orc raid"}
    put_back = describe("run.world", {**run, "world": "reapplied", "ref": "sandbox.xp_rate", "value": 2, "found": 1})
    assert put_back == "↻ Run 7 · Orc raid: sandbox.xp_rate showed 1 again (a restart?); set back to 2."
    lost = describe("run.world", {**run, "world": "lost", "step": "orcs", "module": "luanti", "lost": {"mob": 3}})
    assert "lost 3 mob made by step 'orcs' (a restart of luanti); it cannot be put back" in lost
