"""Parameters to test an action with, made from its JSON Schema when none are given.

They are made by `roadie.registry.examples.example_params` (its docstring says how); a
module whose parameters name things that must exist in its world (a region, a map)
should give `examples` in its schema, or the operator `--params ACTION=JSON`.
"""

from __future__ import annotations

from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

from roadie.registry.examples import example_params

__all__ = ["check_schema", "example_params", "invalid"]


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
