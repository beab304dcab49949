"""The HTTP API end to end: every endpoint on a real store and engine, with the embedded
worker carrying the runs out."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

from roadie.cli.main import app
from roadie.states import AUTO_CLEANUP_ROUNDS
from roadie.web import tokens
from roadie.web.dashboard import run as run_pages
from roadie.web.timeline import layout
from tests.web.conftest import QUICK, SLOW, Site


def _start(site: Site, event: str = "quick-raid", **params: Any) -> dict[str, Any]:
    response = site.post("/api/v1/runs", "operator", json={"event": event, "params": params})
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


def test_health_and_metrics_need_no_token(site: Site) -> None:
    """/healthz says the database answers and the worker runs; /metrics has the gauges and counters."""
    assert site.get("/healthz", None).json() == {"status": "ok", "worker": "running"}
    site.upload(QUICK)
    run = _start(site)
    site.wait_settled(run["id"])
    text = site.get("/metrics", None).text
    assert 'roadie_runs{state="succeeded"} 1.0' in text
    assert "roadie_ledger_rows_live 3.0" in text  # fog lease + 2 raiders, manual cleanup
    assert "roadie_steps_dispatched_total 3.0" in text
    assert "roadie_dispatch_latency_seconds_count 3.0" in text


def test_events_upload_list_versions(site: Site) -> None:
    """An uploaded event is stored as a new version; an identical upload is not a new one."""
    first = site.upload(QUICK)
    assert first.status_code == 201, first.text
    assert first.json()["version"] == 1
    assert site.upload(QUICK).json()["version"] == 1
    assert site.upload(QUICK.replace("A quick raid", "A quicker raid")).json()["version"] == 2
    listed = site.get("/api/v1/events").json()
    assert [(e["event_id"], e["version"]) for e in listed] == [("quick-raid", 2)]
    versions = site.get("/api/v1/events/quick-raid/versions").json()
    assert [v["version"] for v in versions] == [2, 1]
    detail = site.get("/api/v1/events/quick-raid").json()
    assert detail["source"].startswith("id: quick-raid")
    assert detail["title"] == "A quicker raid"
    assert site.get("/api/v1/events/nope").status_code == 404
    assert site.get("/api/v1/events/nope/versions").json()["error"] == "no event 'nope'"


def test_malformed_event_is_refused_with_file_line_field_and_nothing_stored(site: Site) -> None:
    """A misspelled action is reported as the CLI loader reports it, and nothing is stored."""
    bad = QUICK.replace("sandbox.spawn", "sandbox.spwan")
    response = site.post(
        "/api/v1/events?filename=raid.yaml", content=bad.encode(), headers={"content-type": "text/plain"}
    )
    assert response.status_code == 422
    body = response.json()
    assert body["field"] == "phases[1].steps[0].action"
    assert body["error"].startswith("raid.yaml:17: phases[1].steps[0].action: unknown action 'sandbox.spwan'")
    assert body["problems"][0]["line"] == 17
    for junk in (b"\xff\xfe", b"", b"[1, 2", b"id: x\nphases: 3"):
        refused = site.post("/api/v1/events", content=junk, headers={"content-type": "text/plain"})
        assert refused.status_code == 422, junk
        assert refused.json()["error"], junk
    assert site.store_call(lambda s: s.list_events()) == []


def test_run_lifecycle_steps_ledger_plan_cleanup_audit(site: Site) -> None:
    """Start a run with params, watch it end, read its steps and ledger, plan and run
    cleanup, and find every change in the audit log under the token's name."""
    site.upload(QUICK)
    run = _start(site, region="minoc", count=3)
    assert run["params"] == {"region": "minoc", "count": 3}
    assert run["created_by"] == "operator"
    ended = site.wait_settled(run["id"])
    assert ended["status"] == "succeeded"
    assert ended["cleanup_status"] == "pending"

    steps = site.get(f"/api/v1/runs/{run['id']}/steps").json()
    assert [s["status"] for s in steps] == ["succeeded"] * 3
    assert all(s["attempt_log"] for s in steps)
    ledger = site.get(f"/api/v1/runs/{run['id']}/ledger").json()
    live = [r for r in ledger if r["state"] == "live"]
    assert sorted(r["kind"] for r in live) == ["creature"] * 3 + ["override"]
    assert site.get(f"/api/v1/runs/{run['id']}/ledger?state=resolved").json()[0]["kind"] == "@step"

    leases = site.get("/api/v1/leases").json()
    assert [(lease["target"], lease["run_id"], lease["saved"]) for lease in leases] == [
        ("sandbox.weather#minoc", run["id"], "clear")
    ]

    plan = site.get(f"/api/v1/runs/{run['id']}/cleanup/plan").json()
    assert [c["kind"] for c in plan] == ["revert", "restore"]
    assert site.run_row(run["id"]).cleanup_status == "pending"  # a plan calls nothing

    report = site.post(f"/api/v1/runs/{run['id']}/cleanup", "operator").json()
    assert (report["status"], report["reverted"], report["restored"], report["failed"]) == ("complete", 3, 1, 0)
    assert site.get(f"/api/v1/runs/{run['id']}").json()["cleanup_status"] == "complete"
    assert site.get("/api/v1/leases").json() == []

    audit = site.get(f"/api/v1/audit?run={run['id']}").json()
    assert [(a["actor"], a["action"]) for a in audit] == [("operator", "cleanup"), ("operator", "run.start")]
    assert site.get("/api/v1/audit?subject=event:quick-raid").json()[0]["actor"] == "admin"


def test_cleanup_retry_after_incomplete_and_scoped_by_member(site: Site) -> None:
    """A failed revert leaves the run `incomplete`; the same call again retries and
    completes. A member-scoped cleanup leaves the run's own status alone."""
    site.upload(QUICK)
    run = _start(site)
    site.wait_settled(run["id"])
    scoped = site.post(f"/api/v1/runs/{run['id']}/cleanup", "operator", json={"member_key": "nobody"}).json()
    assert (scoped["status"], scoped["member_key"], scoped["calls"]) == ("complete", "nobody", 0)
    assert site.run_row(run["id"]).cleanup_status == "pending"

    site.state.registry.state("sandbox").fail_reverts_next(1)
    first = site.post(f"/api/v1/runs/{run['id']}/cleanup", "operator").json()
    assert first["status"] == "incomplete"
    assert first["failed"] == 2
    assert first["errors"]
    assert site.run_row(run["id"]).cleanup_status == "incomplete"
    again = site.post(f"/api/v1/runs/{run['id']}/cleanup", "operator").json()
    assert (again["status"], again["reverted"]) == ("complete", 2)


def test_a_world_that_loses_reverts_is_reported_partially_rolled_back_until_proved(site: Site) -> None:
    """The world loses every revert: the cleanup's answer and the run say `rolled_back`
    with each raider still there; the worker's rounds run out and the ledger page names
    them. Once the world keeps its reverts, a staff retry and the worker's next round
    prove it: `complete`, verified clean."""
    site.upload(QUICK)
    run = _start(site)
    site.wait_settled(run["id"])
    world = site.state.registry.state("sandbox")
    world.lose_reverts_next(1000)
    report = site.post(f"/api/v1/runs/{run['id']}/cleanup", "operator").json()
    assert (report["status"], report["verdict"]) == ("rolled_back", "partially_rolled_back")
    assert report["verification"]["still_there"] == 2
    assert [f["finding"] for f in report["verification"]["findings"]] == ["still_there"] * 2

    def shown() -> dict[str, Any]:
        return site.get(f"/api/v1/runs/{run['id']}").json()  # type: ignore[no-any-return]

    deadline = time.monotonic() + 60
    # A round counts as it begins: the last one is over once no worker holds the cleanup
    # (a staff retry during it is refused as a cleanup in progress).
    while (now := shown())["cleanup_attempts"] < AUTO_CLEANUP_ROUNDS or now["cleanup_claimed_by"] is not None:
        assert time.monotonic() < deadline, "the worker never took its rounds"
        time.sleep(0.05)
    assert shown()["cleanup_status"] == "rolled_back"
    page = site.get(f"/runs/{run['id']}/ledger").text
    assert "partially rolled back" in page
    assert page.count("<td>came back</td>") == 2  # the raiders, by name
    assert "Retry cleanup" in site.get(f"/runs/{run['id']}/ledger", "operator").text

    world.clear_faults()
    retry = site.post(f"/api/v1/runs/{run['id']}/cleanup", "operator").json()
    assert retry["verdict"] == "partially_rolled_back"  # the last lost redo left them there
    while shown()["cleanup_status"] != "complete":
        assert time.monotonic() < deadline, "the worker never proved the redo"
        time.sleep(0.05)
    assert shown()["cleanup_report"]["verdict"] == "verified_clean"
    assert "verified clean" in site.get(f"/runs/{run['id']}").text


def test_cancel_a_run_in_flight_and_refuse_a_second_cancel(site: Site) -> None:
    site.upload(SLOW)
    run = _start(site, "slow-raid")
    response = site.post(f"/api/v1/runs/{run['id']}/cancel", "operator")
    assert response.status_code == 202
    assert response.json() == {"run_id": run["id"], "cancel_requested": True}
    again = site.post(f"/api/v1/runs/{run['id']}/cancel", "operator")
    assert again.status_code == 409
    assert "cancel" in again.json()["error"]
    ended = site.wait_settled(run["id"])
    assert ended["status"] == "cancelled"
    assert site.post("/api/v1/runs/999/cancel", "operator").status_code == 404


def test_a_run_that_ended_with_rows_live_says_so_on_its_page_until_cleaned_up(site: Site) -> None:
    """A manual policy leaves the fog and the raiders in the world when the run ends: the
    run page says so, that nothing takes them down by itself, and where to clean up."""
    site.upload(QUICK)
    run = _start(site, "quick-raid")
    ended = site.wait_settled(run["id"])
    assert (ended["status"], ended["cleanup_status"]) == ("succeeded", "pending")
    page = site.get(f"/runs/{run['id']}").text
    assert "3 ledger rows of this run are still live in the world" in page
    assert "Nothing takes them down until someone cleans up" in page
    assert f'href="/runs/{run["id"]}/ledger">See what and clean up' in page
    ledger = site.get(f"/runs/{run['id']}/ledger").text  # in the world's words
    assert "raider in yew (creature" in ledger
    assert "sandbox.weather#yew, back to &#39;clear&#39;" in ledger
    assert "its step answered" in ledger
    assert site.post(f"/api/v1/runs/{run['id']}/cleanup", "operator", json={}).status_code == 200
    assert 'id="left-behind"' not in site.get(f"/runs/{run['id']}").text
    ledger = site.get(f"/runs/{run['id']}/ledger", "operator").text  # nothing left: no "Run cleanup"
    assert ("Run cleanup" not in ledger, "Read the world back again" in ledger) == (True, True)


def test_the_ledger_says_roadies_own_kinds_in_words_and_keeps_the_raw_key_at_hand(site: Site) -> None:
    """Before: a step's placeholder and a layer of a lease showed as `@step` and `@layer`
    with a raw step key. Now they say which step (and phase) or which lease and priority,
    the raw kind and key still there (a title, a details element)."""
    broadcast = "      - action: sandbox.broadcast\n"
    banner = "      - action: core.lease\n        with: {lease: sandbox.motd, value: hi, priority: 20}\n"
    site.upload(QUICK.replace(broadcast, banner + broadcast))
    run = site.wait_settled(_start(site)["id"])
    rows = site.get(f"/api/v1/runs/{run['id']}/ledger").json()
    key = next(r["ref"] for r in rows if r["kind"] == "@step")
    page = site.get(f"/runs/{run['id']}/ledger").text
    assert '<span title="kind @step">placeholder for step &#39;raiders&#39; (phase 2)</span>' in page
    assert '<span title="kind @layer">layer of sandbox.motd, priority 20</span>' in page
    assert f"<summary>step key</summary><code>{key}</code>" in page
    assert "<td>@step</td>" not in page


def test_a_finished_runs_page_is_drawn_once_and_drawn_again_when_its_rows_change(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ended run's page, and its changing part for the live refresh, are drawn on the
    first two views (the first learns that the run has ended, the second keeps its rows) and
    given again while its rows read back the same; a cleanup that changes them has the page
    drawn again, and it says what the cleanup did."""
    drawn: list[int] = []

    def counted(run: Any, steps: Any, now: Any, **how: Any) -> Any:
        drawn.append(run.id)
        return layout(run, steps, now, **how)

    monkeypatch.setattr(run_pages, "layout", counted)
    site.upload(QUICK)
    run = _start(site, "quick-raid")
    assert site.wait_settled(run["id"])["cleanup_status"] == "pending"
    before = drawn.count(run["id"])
    page = site.get(f"/runs/{run['id']}").text
    assert 'id="left-behind"' in page
    assert [site.get(f"/runs/{run['id']}").text for _ in range(3)] == [page] * 3
    assert drawn.count(run["id"]) == before + 2
    live = [site.get(f"/runs/{run['id']}/live").text for _ in range(3)]
    assert live[0] in page
    assert live == [live[0]] * 3
    assert drawn.count(run["id"]) == before + 4
    # Kept per viewer: another sees their own name and what their role may do.
    theirs = site.get(f"/runs/{run['id']}", "operator").text
    assert theirs != page
    assert drawn.count(run["id"]) == before + 5
    assert site.post(f"/api/v1/runs/{run['id']}/cleanup", "operator", json={}).status_code == 200
    after = site.get(f"/runs/{run['id']}").text
    assert 'id="left-behind"' not in after
    assert "verified clean" in after
    assert drawn.count(run["id"]) == before + 6


def test_a_start_that_would_meet_a_held_setting_is_refused_with_409_and_force_is_audited(site: Site) -> None:
    """Before: the run started, sent its broadcast to every player, and failed at its
    borrow. Now `POST /api/v1/runs` (and the batch) answers 409 naming the run that holds
    the setting and who started it, storing and sending nothing; `"force": true` starts
    it, and the audit log has `run.force` under the token's name with what it overrode."""
    site.upload(QUICK)
    holder = _start(site, region="yew")
    site.wait_settled(holder["id"])  # its fog over yew stays borrowed: cleanup is manual
    world = site.state.registry.state("sandbox")
    said = len(world.broadcasts())
    body = {"event": "quick-raid", "params": {"region": "yew"}}
    refused = site.post("/api/v1/runs", "operator", json=body)
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error.startswith("run not started (nothing was sent): ")
    assert f"sandbox.weather#yew is held by run {holder['id']} (started by operator) until its cleanup" in error
    assert '"force": true starts it anyway' in error
    batch = site.post("/api/v1/runs/batch", "operator", json={"event": "quick-raid", "runs": [{"params": {}}]})
    assert batch.status_code == 409, batch.text
    assert site.get("/api/v1/runs").json()["total"] == 1
    time.sleep(0.3)  # the embedded worker polls every 0.05 s: it would have sent a step by now
    assert len(world.broadcasts()) == said
    forced = site.post("/api/v1/runs", "operator", json={**body, "force": True})
    assert forced.status_code == 201, forced.text
    [audit] = site.get("/api/v1/audit?action=run.force").json()
    assert (audit["actor"], audit["subject"]) == ("operator", f"run:{forced.json()['id']}")
    [overridden] = audit["detail"]["overridden"]
    assert (overridden["subject"], overridden["held_by"]) == ("sandbox.weather#yew", holder["id"])
    assert site.wait_settled(forced.json()["id"])["status"] == "failed"  # the ledger refused the borrow


def test_list_runs_filters_and_pages(site: Site) -> None:
    site.upload(SLOW)
    site.upload(QUICK)
    regions = ("britain", "moonglow", "trinsic")  # one lease target each: no run refuses another
    ids = [_start(site, "slow-raid", region=r)["id"] for r in regions] + [_start(site, region="minoc")["id"]]
    page = site.get("/api/v1/runs?limit=2").json()
    assert [r["id"] for r in page["items"]] == ids[::-1][:2]
    assert page["total"] == 4
    second = site.get("/api/v1/runs?limit=2&offset=2").json()
    assert [r["id"] for r in second["items"]] == ids[::-1][2:]
    only = site.get("/api/v1/runs?event=quick-raid").json()
    assert [r["id"] for r in only["items"]] == [ids[3]]
    assert only["total"] == 1
    site.wait_settled(ids[3])
    assert site.get("/api/v1/runs?status=succeeded").json()["total"] == 1
    bad = site.get("/api/v1/runs?status=sleeping")
    assert bad.status_code == 422
    assert bad.json()["field"] == "query.status"


def test_malformed_run_bodies_change_nothing(site: Site) -> None:
    """Bad JSON, unknown fields, a bad parameter or an unknown event: a 4xx with a message,
    and no run, no audit entry."""
    site.upload(QUICK)
    before = site.store_call(lambda s: s.list_audit())
    cases = [
        (b"{not json", 400),  # as docs/web.md says: not JSON is 400, JSON that does not fit 422
        (b'{"params": {}}', 422),
        (b'{"event": "quick-raid", "colour": "red"}', 422),
        (b'{"event": "quick-raid", "params": {"count": 0}}', 422),
        (b'{"event": "quick-raid", "params": {"count": "many"}}', 422),
        (b'{"event": "quick-raid", "params": []}', 422),
        (b'{"event": "nope"}', 404),
    ]
    for body, code in cases:
        response = site.post("/api/v1/runs", "operator", content=body, headers={"content-type": "application/json"})
        assert response.status_code == code, (body, response.text)
        assert response.json()["error"], body
    missing = site.post("/api/v1/runs", "operator", json={"params": {}}).json()
    assert missing["field"] == "body.event"
    assert site.store_call(lambda s: s.list_runs()) == []
    assert site.store_call(lambda s: s.list_audit()) == before


def test_forget_a_resource(site: Site) -> None:
    site.upload(QUICK)
    run = _start(site)
    site.wait_settled(run["id"])
    [creature, *_] = [r for r in site.get(f"/api/v1/runs/{run['id']}/ledger").json() if r["kind"] == "creature"]
    bad = site.post(f"/api/v1/resources/{creature['id']}/forget", json={"reason": ""})
    assert bad.status_code == 422
    done = site.post(f"/api/v1/resources/{creature['id']}/forget", json={"reason": "shard wiped"})
    assert done.status_code == 200
    assert done.json()["state"] == "abandoned"
    again = site.post(f"/api/v1/resources/{creature['id']}/forget", json={"reason": "shard wiped"})
    assert again.status_code == 409
    assert site.get(f"/api/v1/audit?run={run['id']}").json()[0]["action"] == "resource.forget"


def test_schedules_and_workers(site: Site) -> None:
    scheduled = QUICK.replace("cleanup: manual", "cleanup: manual\nschedule: {cron: '0 3 * * *'}")
    assert site.upload(scheduled).status_code == 201
    [schedule] = site.get("/api/v1/schedules").json()
    assert schedule["event_id"] == "quick-raid"
    assert schedule["schedule"]["cron"] == "0 3 * * *"
    assert schedule["next_occurrence"].endswith("03:00:00Z")
    workers = site.get("/api/v1/workers").json()
    assert [w["state"] for w in workers] == ["alive"]


def test_tokens_create_list_revoke(site: Site) -> None:
    """An admin mints a token, which works at once and is shown once; revoked, it is refused."""
    made = site.post("/api/v1/tokens", json={"name": "bot", "role": "viewer"})
    assert made.status_code == 201
    secret = made.json()["token"]
    assert tokens.split(secret) is not None
    assert site.client.get("/api/v1/me", headers={"Authorization": f"Bearer {secret}"}).json() == {
        "name": "bot",
        "role": "viewer",
        "via": "bearer",
    }
    listed = site.get("/api/v1/tokens", "admin").json()
    assert [t["name"] for t in listed] == ["viewer", "operator", "admin", "bot"]
    assert all("token" not in t and "secret_hash" not in t for t in listed)
    assert site.post("/api/v1/tokens", json={"name": "bot", "role": "viewer"}).status_code == 409
    assert site.post("/api/v1/tokens", json={"name": "x", "role": "root"}).status_code == 422
    revoked = site.client.delete("/api/v1/tokens/bot", headers=site.auth("admin"))
    assert revoked.status_code == 200
    assert revoked.json()["revoked_at"]
    assert site.client.get("/api/v1/me", headers={"Authorization": f"Bearer {secret}"}).status_code == 401
    wrong = secret[:-4] + "AAAA"
    assert site.client.get("/api/v1/me", headers={"Authorization": f"Bearer {wrong}"}).status_code == 401


def test_run_events_stream_ends_after_the_run(site: Site) -> None:
    """The SSE stream of a settled run sends its state, then `end`, and closes."""
    site.upload(QUICK)
    run = _start(site)
    site.wait_settled(run["id"])
    response = site.get(f"/api/v1/runs/{run['id']}/events")
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.text.startswith("event: run\n")
    assert "event: end\n" in response.text
    assert site.get("/api/v1/runs/12345/events").status_code == 404


def test_many_runs_start_in_one_request_and_a_bad_entry_is_named(site: Site) -> None:
    """`POST /api/v1/runs/batch` starts one run per entry; one bad entry refuses them all
    with a 422 naming it, and nothing is stored."""
    assert site.upload(QUICK).status_code == 201
    made = site.post(
        "/api/v1/runs/batch",
        "operator",
        json={"event": "quick-raid", "runs": [{"params": {"count": 1}}, {"params": {"count": 3}}, {}]},
    )
    assert made.status_code == 201, made.text
    assert [r["params"]["count"] for r in made.json()] == [1, 3, 2]
    refused = site.post(
        "/api/v1/runs/batch", "operator", json={"event": "quick-raid", "runs": [{}, {"params": {"count": 0}}]}
    )
    assert refused.status_code == 422
    assert "runs[1].params" in refused.text
    empty = site.post("/api/v1/runs/batch", "operator", json={"event": "quick-raid", "runs": []})
    assert empty.status_code == 422
    assert len(site.store_call(lambda s: s.list_runs())) == 3


def test_runs_started_through_an_app_without_its_worker_leave_nothing_kept(make_site: Callable[..., Site]) -> None:
    """An engine keeps the frozen definitions of the runs it starts, for its own advance;
    the web app without its worker drains nothing, so it keeps none (they would pile up
    for as long as it serves)."""
    alone = make_site(worker=False)
    assert alone.upload(QUICK).status_code == 201
    made = alone.post("/api/v1/runs/batch", "operator", json={"event": "quick-raid", "runs": [{}, {}]})
    assert made.status_code == 201, made.text
    assert alone.state.engine._definitions == {}


def test_the_workers_page_and_a_warning_on_every_page_while_none_is_alive(make_site: Callable[..., Site]) -> None:
    """Without a worker, every page warns that runs will wait and nothing is cleaned up
    (a fragment each page fetches again every 15 s); the workers page lists them."""
    alone = make_site(worker=False)
    assert "No worker is alive" in alone.get("/workers/warning").text
    assert 'hx-get="/workers/warning"' in alone.get("/").text
    assert "No worker has ever started here." in alone.get("/workers").text


def test_the_workers_page_lists_the_embedded_worker(site: Site) -> None:
    deadline = time.monotonic() + 30
    while 'class="state s-alive"' not in site.get("/workers").text:  # it registers as it starts
        assert time.monotonic() < deadline, "the embedded worker never said it was alive"
        time.sleep(0.05)
    assert "No worker is alive" not in site.get("/workers/warning").text


def test_the_events_pages_show_each_event_its_versions_and_sources(site: Site) -> None:
    site.upload(QUICK)
    site.upload(QUICK.replace("A quick raid", "A quicker raid"))
    listing = site.get("/events").text
    assert 'href="/events/quick-raid"' in listing
    assert "v2" in listing
    page = site.get("/events/quick-raid").text
    assert "A quicker raid" in page
    assert 'href="/events/quick-raid?version=1"' in page
    assert "title: A quick raid" in site.get("/events/quick-raid?version=1").text
    assert site.get("/events/nothing-here").status_code == 404
    weekly = QUICK.replace("id: quick-raid", "id: weekly-raid").replace(
        "cleanup: manual", 'cleanup: manual\nschedule: {cron: "0 20 * * 5", timezone: Europe/London}'
    )
    site.upload(weekly)
    listing = site.get("/events").text
    assert "<code>0 20 * * 5</code>" in listing
    assert "Europe/London" in listing
    assert "Scheduled: <code>0 20 * * 5</code>, next at " in site.get("/events/weekly-raid").text


def test_the_catalogue_shows_each_action_and_lease_with_an_example(site: Site) -> None:
    """The Catalogue page and `GET /api/v1/catalogue`: what the modules offer an author,
    in one serialisation with `roadie actions --json`."""
    body = site.get("/api/v1/catalogue").json()
    modules = {m["name"]: m for m in body}
    spawn = next(a for a in modules["sandbox"]["actions"] if a["id"] == "sandbox.spawn")
    assert spawn["reversible"] == "ledger"
    assert spawn["schema"]["required"] == ["kind", "region"]
    assert spawn["example"].startswith("- action: sandbox.spawn")
    assert {lease["id"] for lease in modules["sandbox"]["leases"]} == {
        "sandbox.motd",
        "sandbox.weather",
        "sandbox.xp_rate",
    }
    page = site.get("/catalogue")
    assert page.status_code == 200
    assert 'id="action-sandbox.spawn"' in page.text
    assert "with: {kind: orc, region: britain}" in page.text
    assert site.get("/api/v1/catalogue", role=None).status_code == 401


def test_a_list_page_hears_of_each_change_as_it_happens(site: Site) -> None:
    """Before: only the run page was live; the runs list, the ledger, the leases and the
    workers needed a reload. Now each list has a stream that says `change` when what it
    shows changes (whichever worker made it), and nothing while nothing does. Each says
    `watching` first, once it has read what it compares against."""
    site.upload(QUICK)
    with site.client.stream("GET", "/live/watch?what=runs", headers=site.auth("viewer")) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.iter_lines()
        assert next(lines) == "event: watching"
        run = _start(site)
        assert next(line for line in lines if line.startswith("event:")) == "event: change"
    site.wait_settled(run["id"])
    for what in ("leases", "workers", f"ledger&run={run['id']}"):
        with site.client.stream("GET", f"/live/watch?what={what}", headers=site.auth("viewer")) as stream:
            assert next(stream.iter_lines()) == "event: watching", what
    assert site.get("/live/watch?what=ledger&run=12345").status_code == 404
    assert site.get("/live/watch?what=ledger").status_code == 422
    assert site.get("/live/watch?what=everything").status_code == 422
    assert site.get("/live/watch?what=runs", role=None).status_code == 401


def test_a_ledgers_stream_says_change_when_its_run_ends_though_no_row_does(site: Site) -> None:
    """The ledger page's clean-up card follows the run's status ("in flight: cancel it
    first"). Before, its stream read only the rows and the cleanup status, so a run that
    ended without a row changing left the page saying it was in flight."""
    site.upload(SLOW)
    run = _start(site, "slow-raid")
    deadline = time.monotonic() + 30
    while site.get(f"/api/v1/runs/{run['id']}").json()["phase"] < 1:  # the omen is done, the raid waits an hour
        assert time.monotonic() < deadline, "the run never reached its second phase"
        time.sleep(0.05)
    with site.client.stream("GET", f"/live/watch?what=ledger&run={run['id']}", headers=site.auth("viewer")) as s:
        lines = s.iter_lines()
        assert next(lines) == "event: watching"
        assert site.post(f"/api/v1/runs/{run['id']}/cancel", "operator").status_code == 202
        heard = next(line for line in lines if line.startswith(("event:", ": keepalive")))
        assert heard == "event: change"
    assert site.wait_settled(run["id"])["cleanup_status"] == "pending"  # manual: no row changed


def test_one_stream_carries_many_subscriptions_each_event_named_by_its_own(site: Site) -> None:
    """`/live/streams?s=...`: what a browser's tabs share (live-worker.js), each event's
    data `{"sub": key, "data": ...}`; a run's stream inside it ends as the run's does."""
    site.upload(QUICK)
    with site.client.stream("GET", "/live/streams?s=runs&s=leases", headers=site.auth("viewer")) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.iter_lines()
        assert next(lines) == ": streaming"
        watching = [next(line for line in lines if line.startswith("event:")) for _ in range(2)]
        assert watching == ["event: watching"] * 2  # each list has read what it compares against
        run = _start(site)
        assert next(line for line in lines if line.startswith("event:")) == "event: change"
        assert json.loads(next(lines).removeprefix("data: "))["sub"] in ("runs", "leases")
    site.wait_settled(run["id"])
    key = f"run:{run['id']}"
    with site.client.stream("GET", f"/live/streams?s={key}&s=ledger:{run['id']}", headers=site.auth("viewer")) as s:
        events = []
        lines = s.iter_lines()
        for line in lines:
            if line.startswith("event:"):
                data = json.loads(next(lines).removeprefix("data: "))
                events.append((line.removeprefix("event: "), data["sub"]))
                if events[-1] == ("end", key):
                    break
        # (the ledger's `watching` comes when its first look is done: before the end, or after)
        assert [e for e in events if e != ("watching", f"ledger:{run['id']}")] == [("run", key), ("end", key)]
    assert site.get("/live/streams").status_code == 422
    assert site.get("/live/streams?s=everything").status_code == 422
    assert site.get("/live/streams?s=run:0").status_code == 422
    assert site.get("/live/streams?" + "&".join(f"s=run:{n}" for n in range(1, 70))).status_code == 422
    assert site.get("/live/streams?s=run:12345").status_code == 404
    assert site.get("/live/streams?s=runs", role=None).status_code == 401


def test_an_event_file_is_checked_without_being_stored(site: Site) -> None:
    """`POST /api/v1/events/check`: an upload's validation, storing nothing."""
    checked = site.post(
        "/api/v1/events/check?filename=raid.yaml", content=QUICK.encode(), headers={"content-type": "text/plain"}
    )
    assert checked.status_code == 200, checked.text
    assert checked.json() | {"message": ""} == {
        "event_id": "quick-raid", "phases": 2, "steps": 3, "version": 1, "current": 0, "message": "", "changes": []
    }  # fmt: skip
    assert site.get("/api/v1/events").json() == []
    site.upload(QUICK)
    # The same event again would make no new version (the store answers the newest), and
    # the check says so; a changed one would make version 2, and says what it changes.
    again = site.post("/api/v1/events/check", content=QUICK.encode(), headers={"content-type": "text/plain"})
    assert (again.json()["version"], again.json()["current"], again.json()["changes"]) == (1, 1, [])
    assert "the same event as version 1" in again.json()["message"]
    changed = QUICK.replace("title: A quick raid", "title: A quicker raid")
    other = site.post("/api/v1/events/check", content=changed.encode(), headers={"content-type": "text/plain"})
    assert (other.json()["version"], other.json()["current"]) == (2, 1)
    assert "+title: A quicker raid" in other.json()["changes"]
    bad = site.post("/api/v1/events/check?filename=bad.yaml", content=b"id: x\nphases: 3\n")
    assert bad.status_code == 422
    assert bad.json()["problems"][0]["source"] == "bad.yaml"


def test_the_audit_log_is_filtered_by_who_what_run_and_time_and_paged(site: Site) -> None:
    """Before: /audit took a run or a subject and ignored `offset`. Now by actor, action (a
    family: `run` takes `run.start` and `run.cancel`), run and time, paged with `offset`;
    the Audit page has the same filters and pages of 100."""
    site.upload(QUICK)
    first = _start(site)
    _start(site)
    everything = site.get("/api/v1/audit").json()
    assert "event.apply" in [a["action"] for a in everything]
    starts = site.get("/api/v1/audit", params={"action": "run"}).json()
    assert [a["action"] for a in starts] == ["run.start", "run.start"]
    assert site.get("/api/v1/audit", params={"action": "run.st"}).json() == []  # a family, not a prefix
    assert [a["subject"] for a in site.get("/api/v1/audit", params={"run": first["id"]}).json()] == [
        f"run:{first['id']}"
    ]
    by_admin = site.get("/api/v1/audit", params={"actor": "admin"}).json()
    assert {a["actor"] for a in by_admin} == {"admin"}
    assert site.get("/api/v1/audit", params={"actor": "nobody"}).json() == []
    paged = [site.get("/api/v1/audit", params={"limit": 1, "offset": i}).json()[0]["id"] for i in range(3)]
    assert paged == [a["id"] for a in everything[:3]]
    stamp = everything[0]["at"]
    assert site.get("/api/v1/audit", params={"since": stamp}).json()[0]["id"] == everything[0]["id"]
    assert everything[0]["id"] not in [a["id"] for a in site.get("/api/v1/audit", params={"until": stamp}).json()]
    page = site.get("/audit", params={"action": "run"}).text
    assert page.count("<td>run.start</td>") == 2
    assert "event.apply" not in page


def test_the_audit_page_shows_each_detail_as_a_key_and_its_value_escaped(site: Site) -> None:
    """Before: an entry's detail was its raw JSON. Now it is a definition list, a key and
    its value each (a string as it is, anything else as JSON), and what a caller wrote
    is escaped."""
    from datetime import UTC, datetime

    detail = {"event": "quick-raid", "params": {"region": "<script>alert(1)</script>", "count": 2}}
    site.store_call(lambda s: s.write_audit(datetime.now(UTC), "mallory", "run.start", "run:9", detail))
    page = site.get("/audit?actor=mallory").text
    assert "<dt>event</dt><dd>quick-raid</dd>" in page
    params = "{&#34;region&#34;: &#34;&lt;script&gt;alert(1)&lt;/script&gt;&#34;, &#34;count&#34;: 2}"
    assert f"<dt>params</dt><dd>{params}</dd>" in page
    assert "<script>alert" not in page


def test_the_cli_json_shows_each_object_as_the_api_does(site: Site) -> None:
    """One serialisation (`roadie.views`): what `--json` prints of a run, its steps and
    ledger, the events, leases, audit, workers and tokens is what the API answers."""
    site.upload(QUICK)
    run = _start(site)
    site.wait_settled(run["id"])
    site.post(f"/api/v1/runs/{run['id']}/cleanup", "operator")
    env = {"ROADIE_DATABASE_URL": site.url, "ROADIE_CONFIG": str(site.home / "roadie.toml")}

    def cli(*args: str) -> Any:
        done = CliRunner().invoke(app, [*args, "--json"], env=env)
        assert done.exit_code == 0, done.output
        return json.loads(done.stdout)

    shown = cli("run", "show", str(run["id"]))
    assert shown["run"] == site.get(f"/api/v1/runs/{run['id']}").json()
    assert shown["steps"] == site.get(f"/api/v1/runs/{run['id']}/steps").json()
    assert shown["resources"] == site.get(f"/api/v1/runs/{run['id']}/ledger").json()
    assert cli("run", "list") == site.get("/api/v1/runs").json()["items"]
    assert cli("event", "list") == site.get("/api/v1/events").json()
    assert cli("leases") == site.get("/api/v1/leases").json()
    assert cli("audit", "--run", str(run["id"])) == site.get(f"/api/v1/audit?run={run['id']}").json()
    assert cli("workers") == site.get("/api/v1/workers").json()
    assert cli("token", "list") == site.get("/api/v1/tokens", "admin").json()


def test_every_list_comes_a_page_at_a_time_with_a_link_to_the_next(site: Site) -> None:
    """Lists answer at most `limit` items and, when there are more, a `Link: <...>;
    rel="next"` header (RFC 8288) whose pages together are the whole list, each item once.
    The ledger pages by id, so rows recorded meanwhile neither shift nor repeat a page."""
    site.upload(QUICK)
    site.upload(QUICK.replace("quick-raid", "quick-raid-2"))
    run = _start(site)
    site.wait_settled(run["id"])

    def walk(path: str, role: str = "viewer") -> tuple[list[Any], int]:
        items, pages, url = [], 0, path
        while url:
            answer = site.get(url, role)
            assert answer.status_code == 200, answer.text
            items += answer.json()
            pages += 1
            link = answer.headers.get("link")
            url = link[link.index("<") + 1 : link.index(">")] if link else ""
            assert not link or link.endswith('>; rel="next"')
        return items, pages

    for path, role in [
        (f"/api/v1/runs/{run['id']}/ledger", "viewer"),
        (f"/api/v1/runs/{run['id']}/steps", "viewer"),
        ("/api/v1/events", "viewer"),
        ("/api/v1/audit", "viewer"),
        ("/api/v1/tokens", "admin"),
    ]:
        whole = site.get(path, role).json()
        assert len(whole) >= 2, path
        assert "link" not in site.get(path, role).headers
        assert walk(f"{path}?limit=1", role) == (whole, len(whole)), path
    assert site.get("/api/v1/runs/1/ledger?limit=0").status_code == 422
    assert site.get("/api/v1/events?offset=-1").status_code == 422
    assert site.get("/api/v1/events/no-such/versions?offset=5").status_code == 404
    assert site.get("/api/v1/events/quick-raid/versions?offset=5").json() == []


def test_a_body_that_is_not_json_is_400_and_one_that_says_the_wrong_thing_422(site: Site) -> None:
    """As docs/web.md and the OpenAPI document say: a body that is not JSON (or not sent as
    JSON) is 400, naming why; JSON that does not fit the route is 422, naming the field."""
    json_ = {"content-type": "application/json"}
    for body, headers in (
        (b"not json", json_),
        (b'{"event": ', json_),
        (b'{"event": "x"}', {"content-type": "text/plain"}),
    ):
        refused = site.post("/api/v1/runs", "operator", content=body, headers=headers)
        assert refused.status_code == 400, body
        assert refused.json()["error"].startswith("the body is not JSON: "), refused.json()
        assert refused.json()["field"] == "body"
    assert site.post("/api/v1/tokens", content=b"{", headers=json_).status_code == 400
    wrong = site.post("/api/v1/runs", "operator", json={"event": "", "params": {}})
    assert (wrong.status_code, wrong.json()["field"]) == (422, "body.event")


def test_the_run_page_tells_what_happened_to_its_setup_in_the_world(site: Site) -> None:
    """What a worker's look at a running run's setup found (issue 37, item 4) is on the
    run's page, in staff's words: a borrow put back, a value left alone, things lost."""
    site.upload(QUICK)
    run = _start(site)
    site.wait_settled(run["id"])
    now = site.state.engine.clock.now()
    notes = [
        ("reapplied", {"ref": "sandbox.xp_rate", "value": 2.0, "found": 1.0}),
        ("left_alone", {"ref": "sandbox.motd", "value": "Raid!", "found": "MAINT"}),
        ("lost", {"step": "raiders", "module": "sandbox", "lost": {"creature": 2}, "refs": ["0x1", "0x2"]}),
    ]
    for what, detail in notes:
        site.store_call(lambda store, w=what, d=detail: store.tell_world(run["id"], w, d, now))
    page = site.get(f"/runs/{run['id']}").text
    assert "Put back: <code>sandbox.xp_rate</code> showed <code>1.0</code> again" in page
    assert "Left alone: <code>sandbox.motd</code> shows <code>MAINT</code>" in page
    assert "<strong>Lost</strong> with a restart of sandbox: 2 creature made by step “raiders”" in page
    audit = site.get(f"/api/v1/audit?run={run['id']}", "admin")
    assert audit.status_code == 200
