"""Parameters made from an action's JSON Schema: required fields only, each from what the
schema offers, and valid against it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ConfigDict, Field

from roadie import protocol
from roadie.conformance import ConformanceOptions, Outcome, example_params, run_conformance
from roadie.conformance.params import invalid
from roadie.conformance.rules.leases import another_value
from roadie.conformance.session import Skipped
from roadie.plugin.server import ModuleServer
from roadie.registry.module import LeaseCall, Module
from tests.conformance.servers import SECRET, URL


class Nested(BaseModel):
    size: int = Field(ge=3)


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(examples=["dragon"])
    level: int = Field(ge=5, le=9)
    colour: str = Field(json_schema_extra={"enum": ["red", "blue"]})
    ratio: float = Field(gt=0)
    tags: list[str] = Field(min_length=2)
    nested: Nested
    maybe: int | None = None
    region: str = Field(description="where, e.g. moonglow")
    flag: bool


def test_required_fields_from_examples_enums_minimums_and_refs() -> None:
    schema = Params.model_json_schema()
    params = example_params(schema)
    assert params == {
        "name": "dragon",
        "level": 5,
        "colour": "red",
        "ratio": 1,
        "tags": ["roadie", "roadie"],
        "nested": {"size": 3},
        "region": "moonglow",
        "flag": False,
    }
    assert invalid(schema, params) is None


def test_a_module_with_only_leases_skips_the_ledger_rules(tmp_path: Path) -> None:
    """No ledger action: nothing to make, so those rules are skipped, not failed."""
    settings = Module("settings_only")
    store: dict[str, Any] = {"motd": "hello"}

    @settings.lease("motd")
    def read(call: LeaseCall) -> Any:
        return store["motd"]

    @read.write
    def write(call: LeaseCall, value: Any) -> None:
        store["motd"] = value

    async def go() -> Any:
        server = ModuleServer(settings, secret=SECRET, ledger_path=str(tmp_path / "keys.db"))
        async with server:
            options = ConformanceOptions(http_transport=httpx.ASGITransport(app=server.app()))
            return await run_conformance(URL, SECRET, options=options)

    report = asyncio.run(go())
    assert report.ok, [r.as_dict() for r in report.results]
    outcome = {r.rule: r.outcome for r in report.results}
    assert outcome["lease_restore"] is Outcome.PASS
    assert outcome["signature"] is Outcome.PASS
    assert {outcome[r] for r in ("same_key", "inspect", "revert_by_key", "foreign_tag", "revert_missing")} == {
        Outcome.SKIP
    }
    assert store == {"motd": "hello"}


def test_a_leases_second_value_is_one_its_value_schema_takes() -> None:
    """Before: the kit borrowed a lease with its value plus one, so a time of day from 0
    to 1 read as 0.25 was borrowed as 1.25 and refused, and the rules were skipped without
    `--value`. A lease whose manifest says what it takes gets a value it takes."""
    clock = protocol.LeaseSpec(name="time_of_day", value={"type": "number", "minimum": 0, "maximum": 1})
    assert another_value(clock, 0.25) == 0.625
    mode = protocol.LeaseSpec(name="mode", value={"enum": ["day", "night"]})
    assert another_value(mode, "day") == "night"
    assert another_value(protocol.LeaseSpec(name="rate"), 3) == 4  # no schema: one of the same kind
    banner = protocol.LeaseSpec(name="motd", value={"type": "string", "examples": ["Orcs!"]})
    assert another_value(banner, "Orcs!", avoid=("",), text_suffix="-layer") == "Orcs!-layer"
    with pytest.raises(Skipped, match="pass --value LEASE=JSON"):
        another_value(protocol.LeaseSpec(name="fixed", value={"const": 1}), 1)
