"""Who may do what: every API endpoint called with no token and with each role's token,
and the dashboard's sessions and CSRF tokens."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.web.conftest import QUICK, ROLES, SLOW, Site

_names = itertools.count()


@dataclass
class Call:
    method: str
    route: str  # the route's template, as FastAPI lists it
    needs: str  # the least role allowed
    prepare: Callable[[Site, dict[str, Any]], tuple[str, dict[str, Any]]]  # -> (path, request kwargs)


def fixed(path: str, **kw: Any) -> Callable[[Site, dict[str, Any]], tuple[str, dict[str, Any]]]:
    return lambda site, ids: (path.format(**ids), kw)


def fresh_region(site: Site) -> str:
    """A region of its own for each run, so that no run's lease refuses another's, and one
    the world has, so that the run's first phase does not fail before the call is made."""
    name = f"r{next(_names)}"
    site.state.registry.state("sandbox").add_region(name)
    return name


def slow_run(site: Site, ids: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    run = site.post("/api/v1/runs", "operator", json={"event": "slow-raid", "params": {"region": fresh_region(site)}})
    return f"/api/v1/runs/{run.json()['id']}/cancel", {}


def new_token(site: Site, ids: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    name = f"t{next(_names)}"
    site.post("/api/v1/tokens", "admin", json={"name": name, "role": "viewer"})
    return f"/api/v1/tokens/{name}", {}


def start_body(site: Site, ids: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "/api/v1/runs", {"json": {"event": "slow-raid", "params": {"region": fresh_region(site)}}}


def start_many_body(site: Site, ids: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    runs = [{"params": {"region": fresh_region(site)}}, {"params": {"region": fresh_region(site)}}]
    return "/api/v1/runs/batch", {"json": {"event": "slow-raid", "runs": runs}}


def token_body(site: Site, ids: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "/api/v1/tokens", {"json": {"name": f"n{next(_names)}", "role": "viewer"}}


CALLS = [
    Call("GET", "/api/v1/me", "viewer", fixed("/api/v1/me")),
    Call("GET", "/api/v1/events", "viewer", fixed("/api/v1/events")),
    Call(
        "POST",
        "/api/v1/events",
        "admin",
        fixed("/api/v1/events", content=QUICK.encode(), headers={"content-type": "text/plain"}),
    ),
    Call(
        "POST",
        "/api/v1/events/check",
        "admin",
        fixed("/api/v1/events/check", content=QUICK.encode(), headers={"content-type": "text/plain"}),
    ),
    Call("GET", "/api/v1/events/{event_id}", "viewer", fixed("/api/v1/events/quick-raid")),
    Call("GET", "/api/v1/events/{event_id}/versions", "viewer", fixed("/api/v1/events/quick-raid/versions")),
    Call("GET", "/api/v1/runs", "viewer", fixed("/api/v1/runs")),
    Call("GET", "/api/v1/catalogue", "viewer", fixed("/api/v1/catalogue")),
    Call("POST", "/api/v1/runs", "operator", start_body),
    Call("POST", "/api/v1/runs/batch", "operator", start_many_body),
    Call("GET", "/api/v1/runs/{run_id}", "viewer", fixed("/api/v1/runs/{run}")),
    Call("POST", "/api/v1/runs/{run_id}/cancel", "operator", slow_run),
    Call("GET", "/api/v1/runs/{run_id}/steps", "viewer", fixed("/api/v1/runs/{run}/steps")),
    Call("GET", "/api/v1/runs/{run_id}/ledger", "viewer", fixed("/api/v1/runs/{run}/ledger")),
    Call("GET", "/api/v1/runs/{run_id}/events", "viewer", fixed("/api/v1/runs/{run}/events")),
    Call("GET", "/api/v1/runs/{run_id}/cleanup/plan", "viewer", fixed("/api/v1/runs/{run}/cleanup/plan")),
    Call("GET", "/api/v1/runs/{run_id}/cleanup/preview", "viewer", fixed("/api/v1/runs/{run}/cleanup/preview")),
    Call(
        "POST",
        "/api/v1/runs/{run_id}/cleanup",
        "operator",
        fixed("/api/v1/runs/{run}/cleanup", json={"member_key": "nobody"}),
    ),
    Call(
        "POST",
        "/api/v1/resources/{resource_id}/forget",
        "admin",
        fixed("/api/v1/resources/{creature}/forget", json={"reason": "gone"}),
    ),
    Call("GET", "/api/v1/leases", "viewer", fixed("/api/v1/leases")),
    Call("GET", "/api/v1/schedules", "viewer", fixed("/api/v1/schedules")),
    Call("GET", "/api/v1/workers", "viewer", fixed("/api/v1/workers")),
    Call("GET", "/api/v1/audit", "viewer", fixed("/api/v1/audit")),
    Call("GET", "/api/v1/tokens", "admin", fixed("/api/v1/tokens")),
    Call("POST", "/api/v1/tokens", "admin", token_body),
    Call("DELETE", "/api/v1/tokens/{token}", "admin", new_token),
]


def test_the_matrix_covers_every_api_route(site: Site) -> None:
    """A new endpoint cannot be added without saying who may call it."""
    paths = site.client.get("/openapi.json").json()["paths"]
    routes = {(method.upper(), path) for path, item in paths.items() if path.startswith("/api/") for method in item}
    assert routes == {(c.method, c.route) for c in CALLS}


def test_role_matrix(site: Site) -> None:
    """Each endpoint by no token, viewer, operator, admin: 401 without a token, 403 below
    its role, 2xx from its role up."""
    assert site.upload(QUICK).status_code == 201
    assert site.upload(SLOW).status_code == 201
    run = site.post("/api/v1/runs", "operator", json={"event": "quick-raid"}).json()
    site.wait_settled(run["id"])
    ledger = site.get(f"/api/v1/runs/{run['id']}/ledger").json()
    ids = {"run": run["id"], "creature": next(r["id"] for r in ledger if r["kind"] == "creature")}
    rank = {role: i for i, role in enumerate(ROLES)}
    seen = []
    for call in CALLS:
        for role in (None, *ROLES):
            path, kw = call.prepare(site, ids)
            headers = {**kw.pop("headers", {}), **site.auth(role)}
            response = site.client.request(call.method, path, headers=headers, **kw)
            if role is None:
                expected = "401"
            elif rank[role] < rank[call.needs]:
                expected = "403"
            else:
                expected = "2xx"
            got = "2xx" if 200 <= response.status_code < 300 else str(response.status_code)
            seen.append((call.method, call.route, role, got, expected))
            if got != "2xx":
                assert response.json()["error"], (call.route, role)
    wrong = [s for s in seen if s[3] != s[4]]
    assert not wrong, wrong


def _login_form_token(site: Site) -> str:
    """The sign-in page's form token (its cookie is kept by the client)."""
    page = site.client.get("/login")
    match = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert match is not None, page.text
    return match.group(1)


def _login(site: Site, role: str) -> str:
    """Sign in on the dashboard with `role`'s token; answers the page's CSRF token."""
    form = {"token": site.tokens[role], "csrf": _login_form_token(site)}
    response = site.client.post("/login", data=form, follow_redirects=False)
    assert response.status_code == 303
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=lax" in cookie.replace("Lax", "lax")
    page = site.client.get("/")
    match = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert match is not None
    return match.group(1)


def test_dashboard_sessions_need_csrf_and_the_right_role(site: Site) -> None:
    """A session may read; a form post without the session's CSRF token is refused; a
    viewer's session may not start runs; signing out ends the session."""
    assert site.upload(QUICK).status_code == 201
    anonymous = site.client.get("/", headers={"accept": "text/html"}, follow_redirects=False)
    assert anonymous.status_code == 303
    assert anonymous.headers["location"] == "/login"
    bad = site.client.post("/login", data={"token": "rd_000000000000_nope", "csrf": _login_form_token(site)})
    assert bad.status_code == 401
    assert "not valid" in bad.text

    csrf = _login(site, "operator")
    assert site.client.get("/api/v1/me").json()["via"] == "session"
    refused = site.client.post("/events/quick-raid/runs", data={}, follow_redirects=False)
    assert refused.status_code == 403
    forged = site.client.post("/events/quick-raid/runs", data={"csrf": "x" * 32}, follow_redirects=False)
    assert forged.status_code == 403
    api_without = site.client.post("/api/v1/runs", json={"event": "quick-raid"})
    assert api_without.status_code == 403
    assert "CSRF" in api_without.json()["error"]
    assert site.store_call(lambda s: s.list_runs()) == []
    started = site.client.post("/events/quick-raid/runs", data={"csrf": csrf}, follow_redirects=False)
    assert started.status_code == 303
    assert started.headers["location"].startswith("/runs/")
    upload = site.client.post("/events", data={"source": QUICK, "csrf": csrf}, follow_redirects=False)
    assert upload.status_code == 403  # uploading events is the admin's

    site.client.post("/logout", data={"csrf": csrf})
    assert site.client.get("/api/v1/me").status_code == 401

    csrf = _login(site, "viewer")
    assert site.client.post("/events/quick-raid/runs", data={"csrf": csrf}).status_code == 403
    assert len(site.store_call(lambda s: s.list_runs())) == 1


def test_revoking_a_token_ends_its_sessions(site: Site) -> None:
    _login(site, "operator")
    assert site.client.get("/api/v1/me").status_code == 200
    assert site.client.delete("/api/v1/tokens/operator", headers=site.auth("admin")).status_code == 200
    assert site.client.get("/api/v1/me").status_code == 401


def test_a_token_revoked_by_another_process_stops_working_within_the_credentials_moment(site: Site) -> None:
    """A server trusts a token or session it checked a moment ago (`credentials_ttl`)
    without reading it again; a revocation made elsewhere (`roadie token revoke`, another
    server) is seen once that moment has passed, both by bearer and by session."""
    _login(site, "operator")
    bearer = site.auth("viewer")
    assert site.client.get("/api/v1/me").status_code == 200
    assert site.get("/api/v1/me", "viewer").status_code == 200
    now = site.state.clock.now()
    site.store_call(lambda s: s.revoke_token("operator", "elsewhere", now))
    site.store_call(lambda s: s.revoke_token("viewer", "elsewhere", now))
    ttl = site.state.options.credentials_ttl
    deadline = time.monotonic() + ttl + 30  # the moment, and a margin for a loaded machine
    while site.client.get("/api/v1/me").status_code == 200 or (
        site.client.get("/api/v1/me", headers=bearer).status_code == 200
    ):
        assert time.monotonic() < deadline, f"still trusted {ttl + 30:g}s after its revocation"
        time.sleep(0.05)
    assert site.client.get("/api/v1/me").status_code == 401


def test_a_refused_upload_shows_the_runs_page_with_why(site: Site) -> None:
    """A bad event file comes back as the runs page, 422, saying what was wrong, with the
    file's text kept in the form; nothing is stored."""
    csrf = _login(site, "admin")
    bad = site.client.post("/events", data={"source": "id: x\nphases: 3\n", "csrf": csrf}, follow_redirects=False)
    assert bad.status_code == 422
    assert "phases" in bad.text
    assert "id: x" in bad.text
    assert site.store_call(lambda s: s.list_events()) == []


def test_the_runs_page_starts_a_run_through_the_events_own_form(site: Site) -> None:
    """Before: the Runs page had a second, blind start form (a text box of name=value
    lines, one error at a time, no preview). Now it chooses the event and goes on to the
    event's own form: a field per param, every problem beside its field, the preview."""
    csrf = _login(site, "operator")
    site.upload(QUICK)
    page = site.client.get("/?event=quick-raid").text
    assert '<form method="get" action="/start" id="start-run">' in page
    assert '<option value="quick-raid" selected>quick-raid (v1) — A quick raid</option>' in page
    assert 'name="params"' not in page
    chosen = site.client.get("/start?event=quick-raid", follow_redirects=False)
    assert (chosen.status_code, chosen.headers["location"]) == (303, "/events/quick-raid#start")
    assert "param.region" in site.client.get("/events/quick-raid").text
    assert site.client.post("/runs", data={"event": "quick-raid", "csrf": csrf}).status_code in (404, 405)
    assert site.store_call(lambda s: s.list_runs()) == []


def test_an_upload_says_which_version_it_stored(site: Site) -> None:
    csrf = _login(site, "admin")
    stored = site.client.post("/events", data={"source": QUICK, "csrf": csrf}, follow_redirects=False)
    assert (stored.status_code, stored.headers["location"]) == (303, "/events/quick-raid?stored=1")
    page = site.client.get(stored.headers["location"]).text
    assert "Stored <code>quick-raid</code> as version 1" in page
    assert 'href="/?event=quick-raid">start one' in page


def test_a_run_starts_from_its_events_form_and_every_bad_param_is_said_at_once(site: Site) -> None:
    """The event page's form has a field per param (choices as a list, bounds and defaults
    said); a start with two bad values names both beside their fields, keeps what was
    typed and starts nothing; with them fixed the run starts."""
    event = QUICK.replace(
        "region: {type: str, default: yew}", "region: {type: str, default: yew, choices: [yew, minoc]}"
    )
    site.upload(event)
    csrf = _login(site, "operator")
    page = site.client.get("/events/quick-raid").text
    assert '<select id="param.region" name="param.region">' in page
    assert '<option value="yew" selected>yew</option>' in page
    assert "int ≥ 1 · default 2" in page
    bad = {"param.region": "britain", "param.count": "0", "csrf": csrf}
    refused = site.client.post("/events/quick-raid/runs", data=bad, follow_redirects=False)
    assert refused.status_code == 422
    assert "2 params to fix before it starts." in refused.text
    assert "must be one of" in refused.text  # region
    assert "must be at least 1" in refused.text  # count
    assert 'value="0"' in refused.text  # kept as typed
    assert site.store_call(lambda s: s.list_runs()) == []
    good = {"param.region": "minoc", "param.count": "3", "csrf": csrf}
    started = site.client.post("/events/quick-raid/runs", data=good, follow_redirects=False)
    assert started.status_code == 303
    [run] = site.store_call(lambda s: s.list_runs())
    assert run.params == {"region": "minoc", "count": 3}


def test_a_preview_says_what_a_run_would_do_and_who_holds_its_settings(site: Site) -> None:
    """Preview renders the run with the form's params and starts nothing: its phases and
    steps, the settings it would borrow and whether another run holds them now (so the
    borrow would be refused), and how it would be taken down."""
    site.upload(QUICK)
    holder = site.post("/api/v1/runs", "operator", json={"event": "quick-raid", "params": {"region": "yew"}}).json()
    site.wait_settled(holder["id"])  # its fog over yew stays borrowed: cleanup is manual
    csrf = _login(site, "operator")
    form = {"param.region": "yew", "param.count": "3", "preview": "1", "csrf": csrf}
    previewed = site.client.post("/events/quick-raid/runs", data=form, follow_redirects=False)
    assert previewed.status_code == 200
    text = previewed.text
    assert "What it would do" in text
    assert "raiders <code>sandbox.spawn</code>" in text
    assert "<code>sandbox.weather#yew</code>" in text
    assert f"held by run {holder['id']} now: this borrow would be refused" in text
    assert "when someone cleans up (cleanup: manual)" in text
    assert len(site.store_call(lambda s: s.list_runs())) == 1  # nothing started
    form["param.region"] = "minoc"
    elsewhere = site.client.post("/events/quick-raid/runs", data=form).text
    assert "<code>sandbox.weather#minoc</code>" in elsewhere
    assert "this borrow would be refused" not in elsewhere


def test_the_start_form_refuses_a_run_whose_setting_is_held_and_offers_to_force_it(site: Site) -> None:
    """Before: the preview said "this borrow would be refused" and Start went ahead. Now
    Start is refused (409) with the holder named beside the form, what was typed kept,
    and a box to start it anyway; ticked, the run starts and the override is audited."""
    site.upload(QUICK)
    holder = site.post("/api/v1/runs", "operator", json={"event": "quick-raid", "params": {"region": "yew"}}).json()
    site.wait_settled(holder["id"])
    csrf = _login(site, "operator")
    form = {"param.region": "yew", "param.count": "3", "csrf": csrf}
    refused = site.client.post("/events/quick-raid/runs", data=form, follow_redirects=False)
    assert refused.status_code == 409
    assert f"sandbox.weather#yew is held by run {holder['id']} (started by operator) until its cleanup" in refused.text
    assert "Ticking the box below starts it anyway" in refused.text
    assert '<input type="checkbox" name="force" value="true" id="force">' in refused.text
    assert 'value="3"' in refused.text  # kept as typed
    assert len(site.store_call(lambda s: s.list_runs())) == 1
    started = site.client.post("/events/quick-raid/runs", data={**form, "force": "true"}, follow_redirects=False)
    assert started.status_code == 303
    [forced] = site.store_call(lambda s: s.list_audit(action="run.force"))
    assert forced.actor == "operator"
    assert forced.detail["overridden"][0]["held_by"] == holder["id"]


def test_a_preview_says_what_each_step_would_make_in_the_worlds_words(site: Site) -> None:
    """Before: a preview named each step's action only. Now a step that makes a count of
    a kind somewhere says so as its ledger rows will ("3 golden goose in yew", the
    action's default count when the step gives none), and any other step says its params."""
    site.upload(QUICK.replace("kind: raider", "kind: golden goose"))
    site.upload(QUICK.replace("id: quick-raid", "id: one-goose").replace(', count: "{{ count }}"', ""))
    csrf = _login(site, "operator")
    form = {"param.region": "yew", "param.count": "3", "preview": "1", "csrf": csrf}
    text = site.client.post("/events/quick-raid/runs", data=form).text
    assert "raiders <code>sandbox.spawn</code>: 3 golden goose in yew</li>" in text
    assert "<code>sandbox.broadcast</code>: message=&#34;Raiders near yew&#34;</li>" in text
    one = site.client.post("/events/one-goose/runs", data=form).text
    assert "raiders <code>sandbox.spawn</code>: 1 raider in yew</li>" in one


def test_signing_in_needs_the_sign_in_pages_own_form(site: Site) -> None:
    """Before: a page on another site could post a token to /login and sign a browser in
    as the attacker (login CSRF). Now the form carries a token that must match a cookie
    only the sign-in page sets (SameSite=Strict): a post without it, or with another, is
    refused with a fresh form, and signs nobody in."""
    token = site.tokens["operator"]
    for form in ({"token": token}, {"token": token, "csrf": "forged" * 4}):
        site.client.cookies.clear()
        if "csrf" in form:
            _login_form_token(site)  # a real cookie, but not for this form
        refused = site.client.post("/login", data=form, follow_redirects=False)
        assert refused.status_code == 403, refused.text
        assert "sign in again" in refused.text
        assert site.client.get("/api/v1/me").status_code == 401
    cookie = site.client.get("/login").headers["set-cookie"]
    assert "roadie_login_csrf=" in cookie
    assert "samesite=strict" in cookie.lower()
    _login(site, "operator")
    assert site.client.get("/api/v1/me").json()["via"] == "session"


def test_a_deep_link_opened_signed_out_lands_on_its_page_after_signing_in(site: Site) -> None:
    """Before: /runs/5/ledger opened signed out went to the sign-in page, and signing in
    landed on the runs list. Now the page asked for is carried through signing in."""
    site.client.cookies.clear()
    asked = site.client.get("/runs/5/ledger?member=a", headers={"accept": "text/html"}, follow_redirects=False)
    assert asked.status_code == 303
    assert asked.headers["location"] == "/login?next=%2Fruns%2F5%2Fledger%3Fmember%3Da"
    page = site.client.get(asked.headers["location"])
    assert '<input type="hidden" name="next" value="/runs/5/ledger?member=a">' in page.text
    form = {"token": site.tokens["viewer"], "csrf": _login_form_token(site), "next": "/runs/5/ledger?member=a"}
    signed_in = site.client.post("/login", data=form, follow_redirects=False)
    assert (signed_in.status_code, signed_in.headers["location"]) == (303, "/runs/5/ledger?member=a")


def test_signing_in_goes_on_to_no_other_site(site: Site) -> None:
    """Where signing in goes next is only ever a path on this site: a link to the sign-in
    page naming another site (an open redirect) lands on the runs list."""
    for elsewhere in (
        "https://evil.example/",
        "//evil.example/runs",
        "/\\evil.example",
        "/\t/evil.example",
        "javascript:alert(1)",
        "runs",
    ):
        site.client.cookies.clear()
        page = site.client.get("/login", params={"next": elsewhere})
        assert 'name="next"' not in page.text, elsewhere
        form = {"token": site.tokens["viewer"], "csrf": _login_form_token(site), "next": elsewhere}
        signed_in = site.client.post("/login", data=form, follow_redirects=False)
        assert (signed_in.status_code, signed_in.headers["location"]) == (303, "/"), elsewhere


def test_every_answer_carries_the_security_headers_and_signed_in_pages_are_not_stored(site: Site) -> None:
    """Before: no Cache-Control, X-Frame-Options or content policy, so back after signing
    out showed the cached page, and any site could frame the dashboard."""
    _login(site, "viewer")
    for path in ("/", "/login", "/api/v1/runs", "/events", "/docs", "/healthz"):
        headers = site.client.get(path, headers={"accept": "text/html"}).headers
        assert headers["x-frame-options"] == "DENY", path
        assert headers["x-content-type-options"] == "nosniff", path
        assert "frame-ancestors 'none'" in headers["content-security-policy"], path
        assert headers["cache-control"] == "no-store", path
    page_policy = site.client.get("/").headers["content-security-policy"]
    assert "script-src 'self';" in page_policy  # no inline script on the dashboard's pages
    static = site.client.get("/static/style.css").headers
    assert "cache-control" not in static or "no-store" not in static["cache-control"]


def test_the_api_docs_are_served_without_a_cdn(site: Site) -> None:
    """Before: /docs loaded Swagger UI from a CDN, and was blank offline. Now every file it
    loads is this server's own."""
    page = site.client.get("/docs")
    assert page.status_code == 200
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources, page.text
    for source in sources:
        assert source.startswith("/"), f"/docs loads {source} from elsewhere"
        assert site.client.get(source).status_code == 200, source
    assert site.client.get("/openapi.json").status_code == 200


def test_a_bad_address_in_a_browser_is_a_page_not_json(site: Site) -> None:
    """Before: /runs/abc showed the API's raw JSON in a browser. Now it is the dashboard's
    404 page; the API still answers JSON."""
    _login(site, "viewer")
    page = site.client.get("/runs/abc", headers={"accept": "text/html"})
    assert page.status_code == 404
    assert page.headers["content-type"].startswith("text/html")
    assert "no such page" in page.text
    api = site.client.get("/api/v1/runs/abc", headers={"accept": "text/html"})
    assert api.status_code == 422
    assert api.json()["field"]


def test_the_refused_and_unknown_pages_have_the_sites_header_and_navigation(site: Site) -> None:
    """Before: a 403 (a viewer's post) and the 404 of an unknown path came without the
    site's navigation or the sign-out button, a dead end. Now they have both."""
    csrf = _login(site, "viewer")
    html = {"accept": "text/html"}
    refused = site.client.post("/events/quick-raid/runs", data={"csrf": csrf}, headers=html)
    unknown = site.client.get("/nowhere/at/all", headers=html)
    for page, code in ((refused, 403), (unknown, 404)):
        assert page.status_code == code
        assert '<a href="/events">Events</a>' in page.text, code
        assert "Sign out" in page.text, code


def test_a_viewer_is_told_where_a_control_would_be_that_its_role_cannot_use(site: Site) -> None:
    """Before: a viewer saw no start form, cancel button or clean-up card, and nothing
    saying why. Now one line stands where each would be: its role cannot, who can."""
    site.upload(SLOW)
    run = site.post("/api/v1/runs", "operator", json={"event": "slow-raid"}).json()
    pages = {
        "/": ("start-note", "start a run"),
        "/events/slow-raid": ("start-note", "start a run"),
        f"/runs/{run['id']}": ("cancel-note", "cancel a run"),
        f"/runs/{run['id']}/ledger": ("cleanup-note", "clean up a run"),
    }
    for path, (note, what) in pages.items():
        said = f'id="{note}">Your role (viewer) cannot {what}: an operator or admin can.</p>'
        assert said in site.get(path, "viewer").text, path
        assert f'id="{note}"' not in site.get(path, "operator").text, path


def test_an_event_file_can_be_chosen_checked_without_storing_and_compared_with_its_last_version(site: Site) -> None:
    """Before: uploading meant pasting text, every upload stored, and nothing showed what
    a new version changed. Now a file can be chosen (multipart), `check` says whether it
    is valid and which version it would become and stores nothing, and an event's page
    shows what changed from the version before it."""
    csrf = _login(site, "admin")
    chosen = {"file": ("raid.yaml", QUICK.encode(), "application/yaml")}
    checked = site.client.post("/events", data={"csrf": csrf, "check": "1"}, files=chosen)
    assert checked.status_code == 200
    assert "raid.yaml is valid: event quick-raid" in checked.text
    assert "storing it would make version 1. Nothing was stored." in checked.text
    assert site.store_call(lambda s: s.list_events()) == []
    bad = site.client.post(
        "/events", data={"csrf": csrf}, files={"file": ("bad.yaml", b"id: x\nphases: 3\n", "application/yaml")}
    )
    assert bad.status_code == 422
    assert "bad.yaml:2" in bad.text
    binary = site.client.post("/events", data={"csrf": csrf}, files={"file": ("x.yaml", b"\xff\xfe", "text/yaml")})
    assert (binary.status_code, "x.yaml: not UTF-8 text" in binary.text) == (422, True)
    empty = site.client.post("/events", data={"csrf": csrf, "source": " "})
    assert (empty.status_code, "choose an event file, or paste its text" in empty.text) == (422, True)

    stored = site.client.post("/events", data={"csrf": csrf}, files=chosen, follow_redirects=False)
    assert stored.headers["location"] == "/events/quick-raid?stored=1"
    assert 'id="changes"' not in site.client.get("/events/quick-raid").text  # nothing before v1
    second = QUICK.replace("default: 2, min: 1", "default: 4, min: 1")
    assert second != QUICK
    site.client.post("/events", data={"csrf": csrf, "source": second, "filename": "raid.yaml"})
    page = site.client.get("/events/quick-raid").text
    assert "What changed from v1 to v2" in page
    assert '<span class="removed">-  count: {type: int, default: 2, min: 1}</span>' in page
    assert '<span class="added">+  count: {type: int, default: 4, min: 1}</span>' in page
