"""The catalogue (`roadie actions`, the Catalogue page): every action and lease a module
offers, with parameters read from its schema and an example step that a real event
accepts."""

from __future__ import annotations

from pathlib import Path

import yaml

from roadie.definitions import load_definition
from roadie.definitions.catalogue import catalogue
from roadie.registry import Answer, Module, Registry, build_registry
from roadie.remote.schema import params_model


def _event_of(steps: list[dict[str, object]]) -> str:
    return yaml.safe_dump({"id": "catalogue", "cleanup": "auto", "phases": [{"name": "all", "steps": steps}]})


def test_every_action_and_lease_is_listed_and_each_example_is_a_step_an_event_accepts(tmp_path: Path) -> None:
    registry = build_registry({"sandbox": {"db": str(tmp_path / "world.db")}})
    modules = {m.name: m for m in catalogue(registry)}
    actions = {a.id: a for m in modules.values() for a in m.actions}
    leases = {lease.id: lease for m in modules.values() for lease in m.leases}
    assert set(actions) == set(registry.action_ids()) - {"core.lease"}
    assert set(leases) == set(registry.lease_ids())
    spawn = actions["sandbox.spawn"]
    assert spawn.reversible == "ledger"
    params = {p.name: p for p in spawn.params}
    assert (params["kind"].required, params["count"].required, params["count"].default) == (True, False, 1)
    assert params["count"].type == "integer (≥ 1, ≤ 500)"
    assert "with: {kind: orc, region: britain}" in spawn.example  # the e.g. of its descriptions
    assert "target: <target>" in leases["sandbox.weather"].example
    assert "priority: 0" in leases["sandbox.motd"].example
    assert "target" not in leases["sandbox.xp_rate"].example
    steps = [yaml.safe_load(entry.example)[0] for entry in [*actions.values(), *leases.values()]]
    definition = load_definition(_event_of(steps), "catalogue.yaml", registry)
    assert len(definition.phases[0].steps) == len(actions) + len(leases)


def test_a_remote_modules_parameters_come_from_the_schema_its_manifest_gave() -> None:
    """A remote action's model is built from JSON Schema: the catalogue reads that schema
    (its enum, default, bounds, examples), not the model's own; a string it says nothing
    about is a placeholder to replace."""
    schema = {
        "type": "object",
        "properties": {
            "mood": {"enum": ["calm", "angry"], "description": "how the crowd feels"},
            "size": {"type": "integer", "minimum": 5, "maximum": 50},
            "zone": {"type": "string", "examples": ["yew"]},
            "loud": {"type": "boolean", "default": False},
            "banner": {"type": "string"},
        },
        "required": ["mood", "size", "zone", "banner"],
    }
    module = Module("arena", description="A remote arena")

    @module.action("crowd", reversible="none", params=params_model("arena.crowd", schema))
    def crowd(call: object) -> Answer:
        return Answer()

    registry = Registry()
    registry.register(module)
    [entry] = catalogue(registry)
    [action] = entry.actions
    assert action.schema == schema
    params = {p.name: p for p in action.params}
    assert params["mood"].choices == ["calm", "angry"]
    assert params["mood"].description == "how the crowd feels"
    assert params["size"].type == "integer (≥ 5, ≤ 50)"
    assert (params["loud"].required, params["loud"].default) == (False, False)
    assert yaml.safe_load(action.example) == [
        {
            "action": "arena.crowd",
            "name": "crowd",
            "with": {"mood": "calm", "size": 5, "zone": "yew", "banner": "<banner>"},
        }
    ]
