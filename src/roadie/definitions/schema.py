"""The JSON Schema of an event file, made from the models, for editors outside Roadie.

`roadie serve` publishes it at `/schema/event.json`; VS Code's YAML extension (and any
editor speaking the YAML language server) completes and checks a file that names it on
its first line (`# yaml-language-server: $schema=https://roadie.example/schema/event.json`).

It says the file's structure only, as `EventDefinition` does: whether an action exists
and whether its `with:` fits is for the server to say (`roadie event validate`, the
site's editor), against the modules it has loaded.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

from roadie.definitions.model import EventDefinition

DRAFT = "https://json-schema.org/draft/2020-12/schema"
PATH = "/schema/event.json"
"""Where `roadie serve` publishes it; stable across releases."""


@functools.cache
def _made() -> dict[str, Any]:
    schema = EventDefinition.model_json_schema(by_alias=True)
    # The model checks `module.action` in a validator, which a schema cannot carry.
    action = schema["$defs"]["StepDef"]["properties"]["action"]
    action["pattern"] = r"^[^.\s]+\.\S+$"
    return {
        "$schema": DRAFT,
        "title": "Roadie event",
        "description": "An event file of Roadie (docs/events.md). The server checks what a schema cannot: "
        "that each action exists, and its with: against the action's parameters.",
        **{key: value for key, value in schema.items() if key not in ("title", "description")},
    }


def event_schema() -> dict[str, Any]:
    """The schema, a copy the caller may change."""
    return copy.deepcopy(_made())


@functools.cache
def event_schema_json() -> bytes:
    """The schema as the server sends it."""
    return json.dumps(_made(), indent=1, sort_keys=False).encode()
