"""The event editor's server side: the page and what it carries, the check it asks as
staff type (with what a save would change), the guard that stores only over the version
whose changes were shown, and the event file's JSON Schema at its stable address. The
editor in a browser is in test_editor_browser.py."""

from __future__ import annotations

import html
import json
import re

from roadie.definitions.schema import event_schema
from tests.web.conftest import QUICK, Site
from tests.web.test_roles import _login

TEXT = {"content-type": "text/plain"}


def test_the_event_schema_is_published_without_a_token(site: Site) -> None:
    answer = site.client.get("/schema/event.json")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/schema+json"
    assert answer.json() == event_schema()
    assert answer.json()["title"] == "Roadie event"


def test_the_editor_is_for_admins_and_carries_the_catalogue_and_the_schema(site: Site) -> None:
    assert site.get("/editor", "operator").status_code == 403
    page = site.get("/editor", "admin")
    assert page.status_code == 200
    assert 'src="/static/vendor/codemirror.min.js"' in page.text
    carried = re.search(r'<script type="application/json" id="editor-data">(.*?)</script>', page.text, re.S)
    assert carried is not None
    data = json.loads(html.unescape(carried.group(1)))
    actions = {a["id"] for m in data["modules"] for a in m["actions"]}
    leases = {lease["id"] for m in data["modules"] for lease in m["leases"]}
    assert "sandbox.spawn" in actions
    assert "sandbox.weather" in leases
    assert data["lease_action"]["id"] == "core.lease"
    assert "lease" in data["lease_action"]["schema"]["properties"]
    assert data["event_schema"] == event_schema()
    assert "# yaml-language-server: $schema=/schema/event.json" in page.text  # a new event starts with it

    assert site.get("/editor?event=nothing-here", "admin").status_code == 404
    site.upload(QUICK)
    editing = site.get("/editor?event=quick-raid", "admin")
    assert "Edit <code>quick-raid</code>" in editing.text
    assert html.escape("{{ region }}") in editing.text or "{{ region }}" in editing.text
    assert 'name="base" id="base" value="1"' in editing.text


def test_the_check_says_what_a_save_would_change(site: Site) -> None:
    new = site.post("/api/v1/events/check?filename=raid.yaml", content=QUICK.encode(), headers=TEXT)
    assert new.status_code == 200, new.text
    assert (new.json()["version"], new.json()["changes"]) == (1, [])
    site.upload(QUICK)
    edited = QUICK.replace("default: 2, min: 1", "default: 4, min: 1")
    checked = site.post("/api/v1/events/check?filename=raid.yaml", content=edited.encode(), headers=TEXT).json()
    assert checked["version"] == 2
    assert "-  count: {type: int, default: 2, min: 1}" in checked["changes"]
    assert "+  count: {type: int, default: 4, min: 1}" in checked["changes"]


def test_the_check_says_a_yaml_mistake_in_words_at_its_line(site: Site) -> None:
    broken = QUICK.replace("      - action: sandbox.broadcast", "     - action: sandbox.broadcast")
    answer = site.post("/api/v1/events/check?filename=raid.yaml", content=broken.encode(), headers=TEXT)
    assert answer.status_code == 422
    [problem] = answer.json()["problems"]
    assert problem["line"] == 13
    assert "list item" in problem["message"]
    assert "<block" not in problem["message"]


def test_a_save_stores_only_over_the_version_whose_changes_were_shown(site: Site) -> None:
    site.upload(QUICK)
    edited = QUICK.replace("default: 2, min: 1", "default: 4, min: 1")
    stale = site.post("/api/v1/events?base_version=0", content=edited.encode(), headers=TEXT)
    assert stale.status_code == 409
    assert "is at version 1 now" in stale.json()["error"]
    stored = site.post("/api/v1/events?base_version=1", content=edited.encode(), headers=TEXT)
    assert (stored.status_code, stored.json()["version"]) == (201, 2)

    csrf = _login(site, "admin")
    form = {"csrf": csrf, "editor": "1", "filename": "quick-raid.yaml", "base": "1", "source": edited}
    moved_on = site.client.post("/events", data=form, follow_redirects=False)
    assert moved_on.status_code == 409
    assert "someone stored it meanwhile" in moved_on.text
    assert "default: 4, min: 1" in moved_on.text  # the text as typed is kept in the editor
    again = edited.replace("title: A quick raid", "title: A quicker raid")
    saved = site.client.post("/events", data={**form, "base": "2", "source": again}, follow_redirects=False)
    assert (saved.status_code, saved.headers["location"]) == (303, "/events/quick-raid?stored=3")


def test_a_refused_save_comes_back_in_the_editor_with_every_problem(site: Site) -> None:
    csrf = _login(site, "admin")
    form = {"csrf": csrf, "editor": "1", "filename": "event.yaml", "base": "0", "source": "id: x\nphases: 3\n"}
    refused = site.client.post("/events", data=form)
    assert refused.status_code == 422
    assert "1 problem: nothing was stored" in refused.text
    assert "event.yaml:2: phases:" in refused.text
    assert 'id="editor-form"' in refused.text
    assert site.store_call(lambda s: s.list_events()) == []
