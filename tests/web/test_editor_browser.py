"""The event editor in a real browser (Debian's Chromium, as test_browser.py): typing
gets completion from the catalogue, a mistake comes back from the server marked at its
line, saving an event that exists shows its changes first and then stores it; at 1366 and
390 px, with axe-core finding nothing, and with the keyboard alone.

Every wait is on a condition (Playwright's `expect` and `wait_for_*`), never a sleep."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from tests.web.test_browser import CHROMIUM, INVASION, _accessibility, server

__all__ = ["server"]  # the fixture, shared with test_browser.py
# A quiet machine runs each test in about half a minute; a loaded one, with the server,
# Chromium and the checks sharing two cores, has been seen to take two.
pytestmark = pytest.mark.timeout(300)
WAIT = 15_000  # ms: for what the server answers (each check, a save)
# The completion offered first, which Enter takes.
CHOSEN = ".cm-tooltip-autocomplete li[aria-selected]"


def _store_invasion(base: str, token: str) -> None:
    stored = httpx.post(
        f"{base}/api/v1/events?filename=invasion.yaml",
        content=INVASION.read_bytes(),
        headers={"Authorization": f"Bearer {token}", "content-type": "text/plain"},
    )
    assert stored.status_code == 201, stored.text


def _sign_in(page: Any, base: str, token: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{base}/login")
    page.fill("#token", token)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Runs", timeout=WAIT)


def _offered(page: Any, label: str) -> None:
    """Wait until completion offers `label` first and Enter would take it: CodeMirror
    ignores Enter for 75 ms after the list changes (so that a fast typist's newline is
    not taken for a choice), so the offer must have stood unchanged a little longer."""
    from playwright.sync_api import expect

    expect(page.locator(CHOSEN)).to_have_text(re.compile("^" + re.escape(label)), timeout=WAIT)
    page.wait_for_function(STEADY, arg=CHOSEN, polling=50, timeout=WAIT)


STEADY = """(selector) => {
  const chosen = document.querySelector(selector);
  const now = performance.now();
  const seen = window.__offer;
  if (!chosen || !seen || seen.node !== chosen || seen.text !== chosen.textContent) {
    window.__offer = chosen ? {node: chosen, text: chosen.textContent, at: now} : null;
    return false;
  }
  return now - seen.at > 200;
}"""


def _text(page: Any) -> str:
    return str(page.evaluate("window.roadieEditor.state.doc.toString()"))


def test_the_editor_completes_marks_the_servers_problems_shows_the_changes_and_saves(
    server: tuple[str, str],
) -> None:
    from playwright.sync_api import expect, sync_playwright

    base, token = server
    _store_invasion(base, token)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 900})
            _sign_in(page, base, token)
            page.goto(f"{base}/events/invasion")
            page.click("#edit-event")
            expect(page.locator("h1")).to_contain_text("Edit invasion", timeout=WAIT)
            expect(page.locator("#check-ok")).to_contain_text(
                "no problem: event invasion, 4 phases and 11 steps", timeout=WAIT
            )
            problems = _accessibility(page, "/editor", "1366 px")

            # A new step at the end: its key, then its action, completed from the catalogue.
            page.click(".cm-content")
            page.keyboard.press("Control+End")
            page.keyboard.type("      - act")
            _offered(page, "action")
            page.keyboard.press("Enter")
            page.keyboard.type("sandbox.sp")
            _offered(page, "sandbox.spawn")
            page.keyboard.press("Enter")
            assert _text(page).endswith("      - action: sandbox.spawn")
            # Its params come from the action's schema.
            page.keyboard.press("Enter")
            page.keyboard.type("with:")
            page.keyboard.press("Enter")
            page.keyboard.type("  cou")
            _offered(page, "count")
            page.keyboard.press("Enter")
            page.keyboard.type("many")
            # The server's word on it, at its line, in the text and in the list above it.
            line = _text(page).count("\n") + 1
            expect(page.locator("#problems")).to_contain_text(
                f"line {line}: phases[3].steps[2].with.count", timeout=WAIT
            )
            expect(page.locator("#problems")).to_contain_text(
                "phases[3].steps[2].with.kind: field required", timeout=WAIT
            )
            expect(page.locator(".cm-lint-marker-error")).to_have_count(2, timeout=WAIT)  # the with: line, and count's
            problems += _accessibility(page, "/editor (with a problem)", "1366 px")
            # The list's entry takes the cursor to the line.
            page.locator("#problems button.problem", has_text="with.count").click()
            assert (
                page.evaluate(
                    "window.roadieEditor.state.doc.lineAt(window.roadieEditor.state.selection.main.head).number"
                )
                == line
            )
            for _ in "many":
                page.keyboard.press("End")
                page.keyboard.press("Backspace")
            page.keyboard.type("2\nkind: goblin\nregion: yew")  # each new line keeps the indentation
            expect(page.locator("#check-ok")).to_contain_text("saving makes version 2", timeout=WAIT)
            expect(page.locator(".cm-lintRange-error")).to_have_count(0, timeout=WAIT)

            # Saving an event that exists shows what it changes first.
            page.click("#review-button")
            expect(page.locator("#review")).to_be_visible(timeout=WAIT)
            expect(page.locator("#review-says")).to_contain_text("as version 2 of invasion", timeout=WAIT)
            expect(page.locator("#review-diff .added")).to_contain_text(
                ["+      - action: sandbox.spawn"], timeout=WAIT
            )
            assert page.evaluate("document.activeElement.id") == "review-heading"
            problems += _accessibility(page, "/editor (review)", "1366 px")
            page.click("#save-button")
            expect(page.locator("#stored")).to_contain_text("Stored invasion as version 2", timeout=WAIT)
            expect(page.locator("#source")).to_contain_text("kind: goblin", timeout=WAIT)
            assert not problems, "\n".join(problems)
        finally:
            browser.close()


def test_the_editor_on_a_phone_with_the_keyboard_alone(server: tuple[str, str]) -> None:
    """At 390 px nothing is wider than the screen and axe finds nothing; the text is
    reached, changed and left with the keyboard (Escape, then Tab), and the save goes
    through its review without a pointer."""
    from playwright.sync_api import expect, sync_playwright

    base, token = server
    _store_invasion(base, token)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 390, "height": 844}, has_touch=True)
            _sign_in(page, base, token)
            page.goto(f"{base}/editor?event=invasion")
            expect(page.locator("#check-ok")).to_be_visible(timeout=WAIT)
            assert page.evaluate("document.documentElement.scrollWidth") <= 390
            problems = _accessibility(page, "/editor", "390 px")

            for _ in range(40):  # Tab through the page to the text
                page.keyboard.press("Tab")
                if page.evaluate("document.activeElement.classList.contains('cm-content')"):
                    break
            else:
                raise AssertionError("Tab never reached the editor's text")
            page.keyboard.press("Control+End")
            page.keyboard.type("      - action: core.log\nwith: {message: the end}")
            expect(page.locator("#check-ok")).to_contain_text("saving makes version 2", timeout=WAIT)
            page.keyboard.press("Tab")  # in the text, Tab indents...
            assert page.evaluate("document.activeElement.classList.contains('cm-content')")
            page.keyboard.press("Control+z")
            page.keyboard.press("Escape")
            page.keyboard.press("Tab")  # ...and after Escape it leaves
            assert page.evaluate("document.activeElement.id") == "review-button"
            page.keyboard.press("Enter")
            expect(page.locator("#review")).to_be_visible(timeout=WAIT)
            assert page.evaluate("document.activeElement.id") == "review-heading"
            assert page.evaluate("document.documentElement.scrollWidth") <= 390
            problems += _accessibility(page, "/editor (review)", "390 px")
            for _ in range(5):
                page.keyboard.press("Tab")
                if page.evaluate("document.activeElement.id") == "save-button":
                    break
            assert page.evaluate("document.activeElement.id") == "save-button"
            page.keyboard.press("Enter")
            expect(page.locator("#stored")).to_contain_text("Stored invasion as version 2", timeout=WAIT)
            assert not problems, "\n".join(problems)
        finally:
            browser.close()
