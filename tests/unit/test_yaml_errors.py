"""A YAML syntax error is said as the mistake it is, at the line of the mistake, with the
field the line belongs to: `file:line: field: message`, by the loader, so the CLI, the
API and the editor all say it the same way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from roadie.definitions import load_definition
from roadie.definitions.loader import _compose
from roadie.definitions.render import field_path
from roadie.definitions.yaml_errors import outline
from roadie.errors import DefinitionError

ROOT = Path(__file__).resolve().parents[2]


def said(text: str) -> str:
    with pytest.raises(DefinitionError) as caught:
        load_definition(text, "e.yaml")
    [problem] = caught.value.problems
    return str(problem)


STEP = "id: a\nphases:\n  - name: x\n    steps:\n      - action: core.log\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # PyYAML: "while parsing a block collection expected <block end>, but found '<block mapping start>'"
        (
            STEP + "        with:\n          message: hi\n       name: y\n",
            "e.yaml:8: phases[0].steps[0].name: invalid YAML: this line is indented 7 spaces, which lines it "
            "up with no key above it: indent it as the key it belongs beside (10, 8, 4 or 0 spaces)",
        ),
        # PyYAML: "mapping values are not allowed here"
        (
            "id: a\nphases:\n  - name: x\n     steps: []\n",
            "e.yaml:4: phases[0].name: invalid YAML: this line is indented more than 'name:' on line 3, which "
            "already has a value: indent it as far as 'name:' (or, if it belongs inside 'name', remove that value)",
        ),
        (
            "id: a\ntitle: Note: orcs\nphases: []\n",
            "e.yaml:2: title: invalid YAML: a ': ' inside an unquoted value: put the value in quotes",
        ),
        # PyYAML: "found unhashable key"
        (
            STEP + "        with:\n          message: {{ region }}\n",
            "e.yaml:7: phases[0].steps[0].with.message: invalid YAML: a template must be quoted: write it in "
            'quotes, e.g. "{{ region }}" (unquoted, YAML reads the { as the start of a mapping)',
        ),
        # PyYAML stops at the end of the file; the quote was opened on line 2.
        (
            'id: a\ntitle: "orcs\nphases: []\n',
            "e.yaml:2: title: invalid YAML: a quote opened on this line is never closed",
        ),
        (
            "id: a\nphases:\n\t- name: x\n",
            "e.yaml:3: phases[0].name: invalid YAML: a tab: YAML is indented with spaces only; "
            "replace the tab with spaces",
        ),
        ("id: a\ntitle\nphases: []\n", "e.yaml:2: invalid YAML: a line with no 'key: value': is a ':' missing?"),
        (
            "id: a\nparams: {region: {type: str}\nphases: []\n",
            "e.yaml:2: params: invalid YAML: the { opened on this line is not closed with }, or a ',' is missing "
            "between its items",
        ),
        (
            "id: a\ntitle: @home\n",
            "e.yaml:2: title: invalid YAML: a value cannot begin with '@' unless it is quoted: put the value in quotes",
        ),
        (
            "id: a\nphases:\n  - name: x\n  steps: []\n",
            "e.yaml:4: phases.steps: invalid YAML: a key among list items: indent it under the item it belongs to, "
            "or begin a new item with '- '",
        ),
        (
            "id: a\nphases:\n  name: x\n  - steps: []\n",
            "e.yaml:4: phases[0].steps: invalid YAML: a list item ('- ') among keys: line it up with the other "
            "items of its list, or put the list under a key",
        ),
        (
            'id: a\ntitle: "orcs" here\n',
            "e.yaml:2: title: invalid YAML: text after a value's closing quote: put the whole value inside the quotes",
        ),
        ("id: a\n---\nid: b\n", "e.yaml:2: invalid YAML: a second document (---): an event file holds one event"),
    ],
)
def test_a_syntax_error_is_said_as_the_mistake_at_its_line(text: str, expected: str) -> None:
    assert said(text) == expected
    assert "<block" not in expected


def test_an_error_it_does_not_know_keeps_pyyamls_words() -> None:
    """Nothing is lost: what is not recognised is said as PyYAML says it, at its line."""
    message = said("id: a\ntitle: &x a\nphases: &x [1]\n")
    assert message.startswith("e.yaml:3: ")
    assert "invalid YAML" in message


def _event_texts() -> list[tuple[str, str]]:
    found = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "src/roadie/examples").glob("*.yaml"))]
    found += [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "integrations").glob("*/*.yaml"))]
    for doc in sorted((ROOT / "docs").rglob("*.md")):
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)):
            found.append((f"{doc.relative_to(ROOT)} block {i + 1}", block))
    return found


@pytest.mark.parametrize(("name", "text"), _event_texts(), ids=lambda v: v if "\n" not in v else "")
def test_the_outline_of_a_valid_file_names_the_fields_the_parser_finds(name: str, text: str) -> None:
    """On the files we ship, the field a line is given by its indentation alone is the
    field the YAML parser puts there."""
    try:
        _, lines, _ = _compose(text, name)
    except Exception:
        pytest.skip("not a whole YAML document")
    parsed: dict[int, set[str]] = {}
    for path, line in lines.items():
        if path:
            parsed.setdefault(line, set()).add(field_path(path))
    read = outline(text)
    wrong = {n: (field_path(line.path), parsed[n]) for n, line in read.items() if n in parsed}
    wrong = {n: v for n, v in wrong.items() if v[0] not in v[1]}
    assert not wrong
