"""A remote action's parameter JSON Schema, as the model event files are checked against."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from roadie.errors import RegistryError
from roadie.modules.sandbox import BuffParams, SpawnParams
from roadie.modules.sandbox import module as sandbox
from roadie.plugin.wire import build_manifest
from roadie.remote.schema import check_value_schema, params_model


def test_fields_are_checked_one_by_one_with_their_place() -> None:
    model = params_model("world.spawn", SpawnParams.model_json_schema())
    assert model.model_validate({"kind": "orc", "region": "yew"}).model_dump(mode="json", by_alias=True) == {
        "kind": "orc",
        "region": "yew",
        "count": 1,
    }
    with pytest.raises(ValidationError) as caught:
        model.model_validate({"kind": "orc", "region": "yew", "count": 5000, "colour": "red"})
    found = {(e["loc"], e["type"]) for e in caught.value.errors()}
    assert found == {(("count",), "json_schema"), (("colour",), "extra_forbidden")}
    assert "greater than the maximum of 500" in str(caught.value)
    with pytest.raises(ValidationError) as missing:
        model.model_validate({"region": "yew"})
    assert [(e["loc"], e["type"]) for e in missing.value.errors()] == [(("kind",), "missing")]


def test_durations_may_be_written_as_operators_write_them() -> None:
    model = params_model("world.buff", BuffParams.model_json_schema())
    assert (
        model.model_validate({"name": "haste", "region": "yew", "duration": "10m"}).model_dump(by_alias=True)[
            "duration"
        ]
        == "10m"
    )
    with pytest.raises(ValidationError):
        model.model_validate({"name": "haste", "region": "yew", "duration": "soon"})


def test_an_optional_property_left_out_is_not_sent() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a"]}
    model = params_model("m.x", schema)
    assert model.model_validate({"a": "x"}).model_dump(mode="json", by_alias=True) == {"a": "x"}
    # No additionalProperties: false, so an extra key is the server's to judge, and is sent.
    assert model.model_validate({"a": "x", "z": 1}).model_dump(mode="json", by_alias=True) == {"a": "x", "z": 1}


def test_rules_about_the_whole_object_are_kept() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "minProperties": 2}
    model = params_model("m.both", schema)
    model.model_validate({"a": "x", "b": "y"})
    with pytest.raises(ValidationError, match=r"does not have enough properties|should be non-empty"):
        model.model_validate({"a": "x"})


def test_a_schema_that_is_not_one_is_refused_when_the_module_is_loaded() -> None:
    with pytest.raises(RegistryError, match="not a valid JSON Schema"):
        params_model("m.bad", {"type": "object", "properties": {"a": {"type": 12}}})
    with pytest.raises(RegistryError, match="must be a JSON object schema"):
        params_model("m.list", {"type": "array"})


def test_a_leases_value_schema_crosses_the_manifest_and_a_broken_one_is_refused() -> None:
    """A module server's manifest says what each lease takes (the engine then refuses a
    borrow of another kind when the event is validated); a schema that is not one refuses
    the lease, naming it."""
    leases = {spec.name: spec.value for spec in build_manifest(sandbox).leases}
    assert leases["xp_rate"] == {"type": "number", "minimum": 0, "examples": [2.0]}
    check_value_schema("sandbox.xp_rate", leases["xp_rate"])
    with pytest.raises(RegistryError, match=r"lamps\.glow: its value is not a valid JSON Schema"):
        check_value_schema("lamps.glow", {"type": "glowing"})
