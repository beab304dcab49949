"""What the loaded modules offer an event's author: each action with its reversible
class, its parameters (the JSON Schema a step's `with:` is checked against) and a step
that would call it; each lease with how it is borrowed. `roadie actions` prints it, and
the dashboard's Catalogue page and `GET /api/v1/catalogue` show it.

An example is made from the schema alone (`roadie.registry.examples`, as the conformance
kit makes its calls): each required parameter with its `examples`, its default, its
first allowed value, or a value of its type within its bounds (a string as `<name>`, to
be replaced), so it is the shape a step needs, not advice on what to put in it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

from roadie.registry import Registry
from roadie.registry.examples import example_params, resolve
from roadie.registry.module import Action, Lease
from roadie.states import Reversible

LEASE_ACTION = "core.lease"


@dataclass
class Parameter:
    name: str
    type: str
    required: bool
    default: Any = None
    description: str = ""
    choices: list[Any] | None = None


@dataclass
class ActionEntry:
    id: str
    reversible: str
    description: str
    params: list[Parameter]
    schema: dict[str, Any]
    example: str


@dataclass
class LeaseEntry:
    id: str
    targeted: bool
    stacks: bool
    description: str
    value: dict[str, Any] | None  # a JSON Schema of the values it takes; None: any
    takes: str  # the same, in words: "number (≥ 0)"
    example: str


@dataclass
class ModuleEntry:
    name: str
    description: str
    actions: list[ActionEntry] = field(default_factory=list)
    leases: list[LeaseEntry] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def catalogue(registry: Registry) -> list[ModuleEntry]:
    """Every loaded module's actions and leases, by module name; `core.lease` (the
    borrowing step) is shown through the leases it borrows, not as an action of its own."""
    entries = []
    for module in sorted(registry.modules, key=lambda m: m.name):
        actions = [_action(a) for a in sorted(module.actions.values(), key=lambda a: a.name) if a.id != LEASE_ACTION]
        leases = [_lease(lease) for lease in sorted(module.leases.values(), key=lambda lease: lease.name)]
        if actions or leases:
            entries.append(ModuleEntry(module.name, module.description, actions, leases))
    return entries


def schema_of(action: Action) -> dict[str, Any]:
    """The JSON Schema of an action's parameters: a remote module's as its manifest gave
    it, a local one's from its model."""
    given = getattr(action.params, "json_schema", None)
    return dict(given) if given else action.params.model_json_schema()


def _action(action: Action) -> ActionEntry:
    schema = schema_of(action)
    params = _parameters(schema)
    with_ = example_params(schema, placeholders=True)
    step: dict[str, Any] = {"action": action.id, "name": action.name.replace("_", " ")}
    if with_:
        step["with"] = with_
    return ActionEntry(
        id=action.id,
        reversible=Reversible(action.reversible).value,
        description=action.description,
        params=params,
        schema=schema,
        example=_yaml(step),
    )


def _lease(lease: Lease) -> LeaseEntry:
    with_: dict[str, Any] = {"lease": lease.id}
    if lease.targeted:
        with_["target"] = "<target>"
    schema = lease.value_schema
    if schema is None:
        with_["value"] = "<value>"
    else:
        wrapped = {"type": "object", "properties": {"value": schema}, "required": ["value"]}
        with_["value"] = example_params(wrapped, placeholders=True)["value"]
    if lease.stacks:
        with_["priority"] = 0
    with_["for"] = "1h"
    step = {"action": LEASE_ACTION, "name": f"borrow {lease.name.replace('_', ' ')}", "with": with_}
    takes = _type_name(schema, schema) if schema is not None else "any value"
    return LeaseEntry(lease.id, lease.targeted, lease.stacks, lease.description, schema, takes, _yaml(step))


def _yaml(step: dict[str, Any]) -> str:
    text: str = yaml.safe_dump([step], sort_keys=False, default_flow_style=None, allow_unicode=True, width=100)
    return text.rstrip()


def _parameters(schema: dict[str, Any]) -> list[Parameter]:
    required = set(schema.get("required", []))
    out = []
    for name in schema.get("properties", {}):
        prop = _property(schema, name)
        out.append(
            Parameter(
                name=name,
                type=_type_name(prop, schema),
                required=name in required,
                default=prop.get("default"),
                description=str(prop.get("description", "")),
                choices=_resolve(prop, schema).get("enum"),
            )
        )
    return out


def _property(schema: dict[str, Any], name: str) -> dict[str, Any]:
    prop = schema.get("properties", {}).get(name, {})
    return prop if isinstance(prop, dict) else {}


def _resolve(prop: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """`prop` with a local `$ref` followed, and an optional (`anyOf` with null) unwrapped."""
    prop = resolve(prop, schema)
    for key in ("anyOf", "oneOf"):
        options = [o for o in prop.get(key, []) if isinstance(o, dict) and o.get("type") != "null"]
        if options:
            return {**_resolve(options[0], schema), **{k: v for k, v in prop.items() if k != key}}
    return prop


def _type_name(prop: dict[str, Any], schema: dict[str, Any]) -> str:
    prop = _resolve(prop, schema)
    kind = prop.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(str(k) for k in kind if k != "null")
    if kind == "array":
        return f"list of {_type_name(prop.get('items', {}), schema)}"
    bounds = [f"≥ {prop['minimum']}" if "minimum" in prop else "", f"≤ {prop['maximum']}" if "maximum" in prop else ""]
    said = ", ".join(b for b in bounds if b)
    return f"{kind} ({said})" if said else str(kind)
