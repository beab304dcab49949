"""Parameters made from an action's JSON Schema alone, for a caller that was given none:
the conformance kit calls each action with them, and the catalogue shows them as the
`with:` of an example step.

Only the required properties are filled, each from what the schema offers, first found:
`const`, `examples`, `default`, `enum`, an "e.g. X" in its description, then the smallest
value of its type the schema allows (`minimum`, `minLength`, `minItems`) — or, for a
string, with `placeholders`, `<its name>` for the reader to replace. A module whose
parameters name things that must exist in its world (a region, a map) should give
`examples` in its schema.
"""

from __future__ import annotations

import re
from typing import Any

_EG = re.compile(r"\be\.g\.,?\s+[\"'`]?([A-Za-z0-9_\-]+)")


def example_params(schema: dict[str, Any], *, placeholders: bool = False) -> dict[str, Any]:
    """Parameters for an action whose parameter schema is `schema` (see the module doc)."""
    value = _example(schema, schema, depth=0, name="", placeholders=placeholders)
    return value if isinstance(value, dict) else {}


def resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """`node` with a local `$ref` (`#/$defs/...`) followed."""
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return merged
    return node


def _example(node: Any, root: dict[str, Any], *, depth: int, name: str, placeholders: bool) -> Any:
    if not isinstance(node, dict) or depth > 8:
        return None
    node = resolve(node, root)
    if "const" in node:
        return node["const"]
    examples = node.get("examples")
    if isinstance(examples, list) and examples:
        return examples[0]
    if "default" in node:
        return node["default"]
    enum = node.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for combinator in ("anyOf", "oneOf"):
        options = node.get(combinator)
        if isinstance(options, list) and options:
            # The first option that is not `null`: an optional field's real type.
            chosen = next((o for o in options if not (isinstance(o, dict) and o.get("type") == "null")), options[0])
            return _example(
                {**{k: v for k, v in node.items() if k != combinator}, **chosen},
                root,
                depth=depth + 1,
                name=name,
                placeholders=placeholders,
            )
    if isinstance(node.get("allOf"), list):
        merged: dict[str, Any] = {k: v for k, v in node.items() if k != "allOf"}
        for part in node["allOf"]:
            if isinstance(part, dict):
                merged.update(resolve(part, root))
        return _example(merged, root, depth=depth + 1, name=name, placeholders=placeholders)
    kind = node.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind == "object" or (kind is None and "properties" in node):
        properties = node.get("properties") or {}
        required = node.get("required") or []
        return {
            key: _example(properties.get(key, {}), root, depth=depth + 1, name=key, placeholders=placeholders)
            for key in required
            if isinstance(key, str)
        }
    if kind == "string":
        return _string(node, f"<{name}>" if placeholders and name else None)
    if kind in ("integer", "number"):
        return _number(node, integer=kind == "integer")
    if kind == "boolean":
        return False
    if kind == "array":
        count = int(node.get("minItems", 0) or 0)
        item = _example(node.get("items", {}), root, depth=depth + 1, name=name, placeholders=placeholders)
        return [item] * count
    if kind == "null":
        return None
    return None


def _string(node: dict[str, Any], placeholder: str | None) -> str:
    description = node.get("description")
    if isinstance(description, str):
        found = _EG.search(description)
        if found:
            return found.group(1)
    if placeholder is not None:
        return placeholder
    low = int(node.get("minLength", 1) or 1)
    high = node.get("maxLength")
    text = "roadie"
    if len(text) < low:
        text = text + "x" * (low - len(text))
    if isinstance(high, int) and len(text) > high:
        text = text[: max(high, 0)]
    return text


def _number(node: dict[str, Any], *, integer: bool) -> int | float:
    value: float = 1
    if "minimum" in node:
        value = node["minimum"]
    elif "exclusiveMinimum" in node:
        value = node["exclusiveMinimum"] + 1
    elif "maximum" in node:
        value = min(1, node["maximum"])
    elif "exclusiveMaximum" in node:
        value = min(1, node["exclusiveMaximum"] - 1)
    return int(value) if integer else value
