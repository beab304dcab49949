"""The conformance kit passes the SDK-served sandbox, and fails, naming the rule, a server
that breaks any one rule."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from roadie import protocol
from roadie.conformance import RULE_NAMES, ConformanceOptions, Outcome, Report, run_conformance
from roadie.modules.sandbox import SandboxWorld
from roadie.modules.sandbox import module as sandbox
from roadie.plugin import PullClient
from tests.conformance.servers import BREAKS, SECRET, URL, Broken, sandbox_server, serving

TARGETS = {"weather": "britain"}


def check(app_for: Any, home: Path, **options: Any) -> tuple[Report, dict[str, Any], dict[str, Any]]:
    """Run the kit against `app_for(server)`; the report, and the world before and after."""

    async def go() -> tuple[Report, dict[str, Any], dict[str, Any]]:
        server = sandbox_server(home)
        async with serving(app_for(server), server) as transport:
            assert isinstance(server.state, SandboxWorld)
            before = server.state.snapshot()
            report = await run_conformance(
                URL, SECRET, options=ConformanceOptions(http_transport=transport, targets=TARGETS, **options)
            )
            return report, before, server.state.snapshot()

    return asyncio.run(go())


def outcomes(report: Report) -> dict[str, str]:
    return {r.rule: f"{r.outcome.value}: {r.detail}" for r in report.results}


def test_sdk_sandbox_passes_every_rule_and_leaves_the_world_as_it_was(tmp_path: Path) -> None:
    """Every rule runs and passes on the SDK's sandbox server, and afterwards the world
    (creatures, items, weather, settings) is exactly what it was."""
    report, before, after = check(lambda server: server.app(), tmp_path)
    assert report.ok, outcomes(report)
    assert [r.rule for r in report.results] == RULE_NAMES
    assert all(r.outcome is Outcome.PASS for r in report.results), outcomes(report)
    assert report.module == "sandbox"
    assert after == before


def test_retryable_answers_are_retried_under_the_same_key(tmp_path: Path) -> None:
    """A server that answers every third call 429, 409 or 503 still conforms: the kit
    retries under the same key, as the engine does."""
    report, before, after = check(lambda server: Broken(server, busy_every=3), tmp_path)
    assert report.ok, outcomes(report)
    assert after == before


@pytest.mark.parametrize("flag", sorted(BREAKS))
def test_a_broken_rule_is_named(tmp_path: Path, flag: str) -> None:
    """Each misbehaviour fails the rule it breaks, with a reason, and the report is not ok."""
    report, before, after = check(lambda server: Broken(server, [flag]), tmp_path)
    rule = report.result(BREAKS[flag])
    assert rule.outcome is Outcome.FAIL, outcomes(report)
    assert rule.detail
    assert not report.ok
    if flag != "no_key_ledger":
        # Cleanup leaves the world as it found it, even around a broken rule (but a
        # server that acts again for every dispatch of a key cannot be undone by key).
        assert after == before, outcomes(report)


def test_broken_server_without_flags_passes(tmp_path: Path) -> None:
    """The broken server's plumbing is not itself a break: with no flag it conforms."""
    report, before, after = check(lambda server: Broken(server), tmp_path)
    assert report.ok, outcomes(report)
    assert after == before


def test_targeted_lease_without_a_target_is_skipped_and_params_are_used(tmp_path: Path) -> None:
    """Without --target the targeted lease is skipped (not failed); --params picks the action."""

    async def go() -> Report:
        server = sandbox_server(tmp_path)
        async with serving(server.app(), server) as transport:
            options = ConformanceOptions(
                http_transport=transport, params={"place_item": {"kind": "chest", "region": "yew", "count": 2}}
            )
            return await run_conformance(URL, SECRET, options=options)

    report = asyncio.run(go())
    assert report.ok, outcomes(report)
    assert "place_item" in report.result("manifest").detail
    assert "2 resource(s)" in report.result("same_key").detail
    assert "skipped weather" in report.result("lease_restore").detail


def test_unreachable_server_fails_the_manifest_and_skips_the_rest(tmp_path: Path) -> None:
    """Nothing listening: the manifest rule fails with the transport's error, the others
    are skipped, and the report is not ok."""
    report = asyncio.run(run_conformance("http://127.0.0.1:9", SECRET, options=ConformanceOptions(timeout=1.0)))
    assert report.result("manifest").outcome is Outcome.FAIL
    assert "request failed" in report.result("manifest").detail
    assert {r.outcome for r in report.results[1:-1]} == {Outcome.SKIP}
    assert not report.ok


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_pull_mode_checks_a_polling_module(tmp_path: Path) -> None:
    """--pull: the kit serves the engine's gateway on loopback; the SDK's PullClient polls
    it, answers every rule's calls from the queue, and the world ends as it began."""

    async def go() -> tuple[Report, dict[str, Any], dict[str, Any]]:
        url = f"http://127.0.0.1:{free_port()}"
        client = PullClient(
            sandbox,
            url,
            SECRET,
            str(tmp_path / "keys.db"),
            settings={"db": "world.db"},
            base_dir=str(tmp_path),
            wait=1.0,
        )
        polling = asyncio.create_task(client.run())
        options = ConformanceOptions(pull=True, targets=TARGETS, timeout=20, announce_timeout=20)
        checking = asyncio.create_task(run_conformance(url, SECRET, options=options))
        await asyncio.wait_for(client.announced.wait(), 20)
        assert isinstance(client.server.state, SandboxWorld)
        before = client.server.state.snapshot()
        report = await checking
        after = client.server.state.snapshot()
        client.stop()
        await polling
        return report, before, after

    report, before, after = asyncio.run(go())
    assert report.mode == "pull"
    assert report.ok, outcomes(report)
    assert report.result("signature").detail.startswith("pull:")
    assert after == before


_VERIFY_ANSWER = protocol.verify_answer


def _not_bound(secrets: Any, request_id: str, path: str, headers: Any, body: bytes, **kwargs: Any) -> None:
    """Checks the signature, but not that it was made for this request."""
    _VERIFY_ANSWER(secrets, headers.get(protocol.H_ID) or request_id, path, headers, body, **kwargs)


@pytest.mark.parametrize(
    ("verify_answer", "forged"),
    [
        (lambda *args, **kwargs: None, "replayed and unsigned and wrongly signed"),
        (_not_bound, "replayed:"),
    ],
    ids=["no check", "not bound to the poll"],
)
def test_pull_mode_fails_a_module_that_acts_on_a_forged_poll_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verify_answer: Any, forged: str
) -> None:
    """A polling module that does not check its poll answers' signature, or not that it
    was made for the poll it sent, carries out work anyone between it and the engine wrote
    or recorded: the signature rule says so."""
    monkeypatch.setattr(protocol, "verify_answer", verify_answer)

    async def go() -> Report:
        url = f"http://127.0.0.1:{free_port()}"
        client = PullClient(
            sandbox, url, SECRET, str(tmp_path / "keys.db"), settings={"db": "world.db"},
            base_dir=str(tmp_path), wait=1.0,
        )  # fmt: skip
        polling = asyncio.create_task(client.run())
        options = ConformanceOptions(pull=True, targets=TARGETS, timeout=20, announce_timeout=20, rules=("signature",))
        report = await run_conformance(url, SECRET, options=options)
        client.stop()
        await polling
        return report

    report = asyncio.run(go())
    signature = report.result("signature")
    assert signature.outcome is Outcome.FAIL, outcomes(report)
    assert f"carried out a call from a poll answer that was {forged}" in signature.detail
    assert report.result("cleanup").outcome is Outcome.PASS, outcomes(report)


def test_the_kit_sends_fences_and_takes_a_lease_targets_mark_without_raising_it(tmp_path: Path) -> None:
    """A live module whose lease targets carry marks from the engine's borrows (here 500 on
    weather#britain, 40 on xp_rate): the kit's lease writes take the mark the 412 tells
    (an equal fence is accepted), every rule passes, and the marks are what they were."""

    async def go() -> tuple[Report, dict[str, int | None]]:
        server = sandbox_server(tmp_path)
        async with serving(server.app(), server) as transport:
            assert server.ledger.begin_apply("engine-1", "weather", "britain", 1, fence=500).run
            assert server.ledger.begin_apply("engine-2", "xp_rate", None, 1, fence=40).run
            options = ConformanceOptions(http_transport=transport, targets=TARGETS)
            report = await run_conformance(URL, SECRET, options=options)
            marks = {t: server.ledger.mark("lease", t) for t in ("weather#britain", "xp_rate", "motd")}
            return report, marks

    report, marks = asyncio.run(go())
    assert report.ok, outcomes(report)
    assert "apply under 499 after 500: 412" in report.result("stale_fence").detail
    assert marks == {"weather#britain": 500, "xp_rate": 40, "motd": 2}
