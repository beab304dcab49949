"""Parameters to test an action with, made from its JSON Schema when none are given.

Only the required properties are filled, each from what the schema offers, first found:
`const`, `examples`, `default`, `enum`, an "e.g. X" in its description, then the smallest
value of its type the schema allows (`minimum`, `minLength`, `minItems`). A module whose
parameters name things that must exist in its world (a region, a map) should give
`examples` in its schema, or the operator `--params ACTION=JSON`.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

_EG = re.compile(r"\be\.g\.,?\s+[\"'`]?([A-Za-z0-9_\-]+)")


def check_schema(schema: Any) -> str | None:
    """Why `schema` is not a valid JSON Schema, or None."""
    if not isinstance(schema, dict):
        return f"a schema must be an object, not {type(schema).__name__}"
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        return exc.message
    return None


def invalid(schema: dict[str, Any], params: Any) -> str | None:
    """Why `params` does not satisfy `schema`, or None."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    error = jsonschema.exceptions.best_match(cls(schema).iter_errors(params))
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message


def example_params(schema: dict[str, Any]) -> dict[str, Any]:
    """Parameters for an action whose parameter schema is `schema` (see the module doc)."""
    value = _example(schema, schema, depth=0)
    return value if isinstance(value, dict) else {}


def _resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return merged
    return node


def _example(node: Any, root: dict[str, Any], *, depth: int) -> Any:
    if not isinstance(node, dict) or depth > 8:
        return None
    node = _resolve(node, root)
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
            return _example({**{k: v for k, v in node.items() if k != combinator}, **chosen}, root, depth=depth + 1)
    if isinstance(node.get("allOf"), list):
        merged: dict[str, Any] = {k: v for k, v in node.items() if k != "allOf"}
        for part in node["allOf"]:
            if isinstance(part, dict):
                merged.update(_resolve(part, root))
        return _example(merged, root, depth=depth + 1)
    kind = node.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind == "object" or (kind is None and "properties" in node):
        properties = node.get("properties") or {}
        required = node.get("required") or []
        return {
            name: _example(properties.get(name, {}), root, depth=depth + 1)
            for name in required
            if isinstance(name, str)
        }
    if kind == "string":
        return _string(node)
    if kind in ("integer", "number"):
        return _number(node, integer=kind == "integer")
    if kind == "boolean":
        return False
    if kind == "array":
        count = int(node.get("minItems", 0) or 0)
        item = _example(node.get("items", {}), root, depth=depth + 1)
        return [item] * count
    if kind == "null":
        return None
    return None


def _string(node: dict[str, Any]) -> str:
    description = node.get("description")
    if isinstance(description, str):
        found = _EG.search(description)
        if found:
            return found.group(1)
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
