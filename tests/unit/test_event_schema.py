"""The JSON Schema of an event file, made from the models: what the events we ship say
fits it, and a broken one does not."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from roadie.definitions import load_definition
from roadie.definitions.schema import event_schema, event_schema_json

ROOT = Path(__file__).resolve().parents[2]


def _as_an_editor_reads(text: str) -> Any:
    """The document as JSON values, as an editor's YAML server sees it: a timestamp is a string."""
    return json.loads(json.dumps(yaml.safe_load(text), default=str))


def shipped_events() -> list[tuple[str, str]]:
    """The example events, and every whole event in the docs' YAML blocks."""
    found = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "src/roadie/examples").glob("*.yaml"))]
    for doc in sorted((ROOT / "docs").rglob("*.md")):
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)):
            if re.search(r"^id:", block, re.M) and re.search(r"^phases:", block, re.M):
                found.append((f"{doc.relative_to(ROOT)} block {i + 1}", block))
    return found


def test_there_are_events_to_check() -> None:
    assert len(shipped_events()) >= 2


@pytest.mark.parametrize(("name", "text"), shipped_events(), ids=[name for name, _ in shipped_events()])
def test_every_shipped_event_fits_the_schema(name: str, text: str) -> None:
    load_definition(text, name)  # the loader takes it (structure only: no registry)
    errors = list(Draft202012Validator(event_schema()).iter_errors(_as_an_editor_reads(text)))
    assert not errors, [e.message for e in errors]


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda e: e.pop("phases"), "'phases' is a required property"),
        (lambda e: e.update(cleanup="sometimes"), "'sometimes' is not one of ['auto', 'manual']"),
        (lambda e: e["phases"][0]["steps"][0].update(action="spawn"), "does not match"),
        (lambda e: e["phases"][0]["steps"][0].update(retries=3), "Additional properties are not allowed"),
        (lambda e: e.update(duration="a while"), "is not valid under any of the given schemas"),
        (lambda e: e.update(id="Big Raid"), "does not match"),
    ],
)
def test_a_broken_event_does_not(change: Any, where: str) -> None:
    event = _as_an_editor_reads((ROOT / "src/roadie/examples/invasion.yaml").read_text())
    change(event)
    errors = [e.message for e in Draft202012Validator(event_schema()).iter_errors(event)]
    assert any(where in message for message in errors), errors


def test_the_schema_is_a_valid_schema_and_sent_as_made() -> None:
    Draft202012Validator.check_schema(event_schema())
    assert json.loads(event_schema_json()) == event_schema()
