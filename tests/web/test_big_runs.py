"""A run of a thousand steps on the site: its run page and ledger page summarise by phase,
action and state and show a page of rows, so they stay small whatever the run's size;
paging and filters are query parameters that return the right rows."""

from __future__ import annotations

import re

from tests.web.conftest import Site

PAGE_BYTES = 100_000
PAGE_NODES = 2_000
REDRAW_BYTES = 100_000


def big_event(steps: int, event_id: str = "big") -> str:
    """One phase of `steps` sandbox spawns (each a creature in the ledger), and a phase of
    two logs: a run of it is a thousand rows on every page that lists them."""
    lines = [f"id: {event_id}", "cleanup: manual", "phases:", "  - name: horde", "    steps:"]
    for n in range(steps):
        action = "sandbox.spawn" if n % 10 else "sandbox.broadcast"
        with_ = "{kind: orc, region: yew, count: 1}" if n % 10 else f'{{message: "wave {n}"}}'
        lines.append(f"      - {{action: {action}, name: s{n:05d}, with: {with_}}}")
    lines += ["  - name: after", "    steps:", "      - {action: core.log, name: last, with: {message: done}}"]
    return "\n".join(lines) + "\n"


def nodes(html: str) -> int:
    """Elements in a page, as a browser would count them (`querySelectorAll('*')`): its
    opening tags, plus the html, head and body a browser adds to a part of a page."""
    return len(re.findall(r"<[a-zA-Z]", html))


def test_a_thousand_step_run_and_its_ledger_are_small_pages(site: Site) -> None:
    """Before: the run page was 501 KB and 14,113 elements (a row per step, and a
    timeline of one), a redraw of its live part as much, and the ledger page 866 KB and
    34,288 (every row and every cleanup call, the clean-up button under them all)."""
    assert site.upload(big_event(1000)).status_code == 201
    run_id = site.post("/api/v1/runs", "operator", json={"event": "big"}).json()["id"]
    site.wait_settled(run_id, timeout=300)
    for path, role in (
        (f"/runs/{run_id}", "viewer"),
        (f"/runs/{run_id}/live", "viewer"),
        (f"/runs/{run_id}/ledger", "operator"),
    ):
        page = site.get(path, role).text
        assert len(page.encode()) < PAGE_BYTES, f"{path}: {len(page.encode())} bytes"
        assert nodes(page) < PAGE_NODES, f"{path}: {nodes(page)} elements"
    ledger = site.get(f"/runs/{run_id}/ledger", "operator").text
    # The clean-up card comes before the rows, not after a thousand of them.
    assert ledger.index('id="cleanup-button"') < ledger.index('id="ledger"')

    # Paging and filters: query parameters, links a browser follows without JavaScript.
    steps = site.get(f"/api/v1/runs/{run_id}/steps?limit=2000").json()
    spawns = [s["name"] for s in steps if s["action"] == "sandbox.spawn"]
    assert len(steps) == 1001
    assert len(spawns) == 900

    def names(path: str) -> list[str]:
        return re.findall(r"<td>(s\d{5}|last)</td>", site.get(path).text)

    assert names(f"/runs/{run_id}") == [f"s{n:05d}" for n in range(50)]
    assert names(f"/runs/{run_id}?page=3") == [f"s{n:05d}" for n in range(100, 150)]
    assert names(f"/runs/{run_id}/live?page=3") == names(f"/runs/{run_id}?page=3")
    assert names(f"/runs/{run_id}?action=sandbox.spawn&page=18") == spawns[850:900]
    assert names(f"/runs/{run_id}?action=sandbox.broadcast&page=2") == [f"s{n:05d}" for n in range(500, 1000, 10)]
    page = site.get(f"/runs/{run_id}?phase=2").text
    assert "1–1 of 1 steps in phase 2" in page
    assert names(f"/runs/{run_id}?phase=2") == ["last"]
    assert "No step is shown by this filter" in site.get(f"/runs/{run_id}?state=failed").text
    assert "1–50 of 1001 steps succeeded" in site.get(f"/runs/{run_id}?state=succeeded").text
    assert 'href="?action=sandbox.spawn&amp;page=2" rel="next"' in site.get(f"/runs/{run_id}?action=sandbox.spawn").text
    assert site.get(f"/runs/{run_id}?page=0").status_code == 422

    ledger_rows = site.get(f"/api/v1/runs/{run_id}/ledger?limit=5000").json()
    creatures = [r["id"] for r in ledger_rows if r["kind"] == "creature"]
    assert len(creatures) == 900

    def row_ids(path: str) -> list[int]:
        return [int(i) for i in re.findall(r'<tr>\s*<td class="num">(\d+)</td>', site.get(path).text)]

    assert row_ids(f"/runs/{run_id}/ledger?state=live&page=2") == creatures[50:100]
    assert row_ids(f"/runs/{run_id}/ledger?state=live&action=sandbox.spawn&phase=1&page=18") == creatures[850:900]
    assert row_ids(f"/runs/{run_id}/ledger?state=live&phase=2") == []
    assert row_ids(f"/runs/{run_id}/ledger?state=failed") == []
    assert "900 live" in site.get(f"/runs/{run_id}/ledger").text
