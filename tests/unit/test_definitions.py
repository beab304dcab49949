"""Event files to validated definitions, with every mistake at its line; rendering a run."""

from __future__ import annotations

import json
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from roadie.definitions import EventDefinition, FrozenDefinition, load_definition, load_file, render
from roadie.definitions.model import ParamSpec
from roadie.definitions.render import render_string
from roadie.errors import DefinitionError, Problem
from roadie.modules import core
from roadie.registry import Module, Registry, build_registry


class SpawnParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    creature: str
    count: int = 1
    region: str = "britain"
    tags: list[str] = []


@pytest.fixture
def registry() -> Registry:
    world = Module("world")

    @world.action("spawn", reversible="ledger", params=SpawnParams)
    def spawn(call: Any) -> None: ...

    @spawn.revert
    def despawn(call: Any) -> None: ...

    @world.lease("xp_rate")
    def xp_rate(call: Any) -> float: ...

    @xp_rate.write
    def set_xp_rate(call: Any, value: Any) -> None: ...

    @world.lease("weather", targeted=True)
    def weather(call: Any) -> str: ...

    @weather.write
    def set_weather(call: Any, value: Any) -> None: ...

    reg = Registry()
    reg.register(world)
    reg.register(core.module)
    return reg


HARVEST = """\
id: harvest
title: Harvest festival
duration: 2h
params:
  count:
    type: int
    default: 3
  creature:
    type: str
    default: sheep
  rate: {type: float}
phases:
  - name: announce
    steps:
      - action: core.log
        with: {message: "{{ event.title }} begins"}
  - name: spawn
    after: 10m
    steps:
      - action: world.spawn
        with:
          creature: "{{ creature }}"
          count: "{{ count }}"
      - action: core.lease
        with:
          lease: world.xp_rate
          value: "{{ rate }}"
          for: 1h
"""


def problems_of(text: str, source: str = "harvest.yaml", reg: Registry | None = None) -> list[Problem]:
    with pytest.raises(DefinitionError) as caught:
        load_definition(textwrap.dedent(text), source, reg)
    return caught.value.problems


def lines_of(problems: list[Problem]) -> list[str]:
    return [str(p) for p in problems]


# --- loading ---------------------------------------------------------------------------------


def test_a_good_file_loads(registry: Registry, tmp_path: Path) -> None:
    """A well-formed file loads from disk into a definition with durations in seconds."""
    path = tmp_path / "harvest.yaml"
    path.write_text(HARVEST)
    definition = load_file(path, registry)
    assert isinstance(definition, EventDefinition)
    assert definition.id == "harvest"
    assert definition.duration == 7200.0
    assert definition.phases[1].after == 600.0
    assert [s.action for s in definition.phases[1].steps] == ["world.spawn", "core.lease"]
    assert definition.phases[1].steps[1].with_["for"] == "1h"


def test_a_good_file_loads_without_a_registry() -> None:
    """Without a registry only structure and templates are checked, so unknown actions pass."""
    definition = load_definition(HARVEST.replace("world.spawn", "world.nothing"), "h.yaml", None)
    assert definition.phases[1].steps[0].action == "world.nothing"


def test_misspelled_action_reports_file_line_field_and_suggestion(registry: Registry) -> None:
    """An unknown action is reported at the line of `action` with the registry's suggestion."""
    text = HARVEST.replace("action: world.spawn", "action: world.spwan")
    problems = problems_of(text, reg=registry)
    assert lines_of(problems) == [
        "harvest.yaml:20: phases[1].steps[0].action: unknown action 'world.spwan' (did you mean 'world.spawn'?)"
    ]
    assert problems[0].as_dict() == {
        "source": "harvest.yaml",
        "line": 20,
        "field": "phases[1].steps[0].action",
        "message": "unknown action 'world.spwan' (did you mean 'world.spawn'?)",
    }


def test_missing_field_is_placed_at_its_parent_mapping() -> None:
    """A missing field says "field required" at the line of the mapping that lacks it."""
    problems = problems_of(
        """\
        id: x
        phases:
          - name: one
            steps:
              - with: {message: hi}
        """
    )
    assert lines_of(problems) == ["harvest.yaml:5: phases[0].steps[0].action: field required"]


def test_missing_top_level_field_is_placed_on_the_first_line() -> None:
    """A definition without phases is refused at the document's first line."""
    assert lines_of(problems_of("id: x\ntitle: nothing\n")) == ["harvest.yaml:1: phases: field required"]


def test_extra_field_is_named_with_a_close_match() -> None:
    """A misspelled key is an unknown field, with the model's closest field suggested."""
    problems = problems_of(
        """\
        id: x
        phases:
          - name: one
            steps:
              - actoin: core.log
                action: core.log
        """
    )
    assert lines_of(problems) == [
        "harvest.yaml:5: phases[0].steps[0].actoin: unknown field 'actoin' (did you mean 'action'?)"
    ]


def test_extra_field_suggests_the_alias_an_operator_writes() -> None:
    """A step's `with_` field is suggested by the name written in files, `with`."""
    problems = problems_of(
        """\
        id: x
        phases:
          - name: one
            steps:
              - action: core.log
                wiht: {message: hi}
        """
    )
    assert problems[0].message == "unknown field 'wiht' (did you mean 'with'?)"


def test_extra_field_without_close_match_has_no_suggestion() -> None:
    """No suggestion is invented when nothing is close."""
    problems = problems_of("id: x\nzzzzzz: 1\nphases: [{name: a, steps: [{action: core.log}]}]\n")
    assert problems[0].message == "unknown field 'zzzzzz'"
    assert problems[0].line == 2


def test_bad_duration_keeps_the_parser_message_without_pydantic_prefix() -> None:
    """A duration that does not parse is reported in the duration parser's words, at its line."""
    problems = problems_of(
        """\
        id: x
        phases:
          - name: one
            after: 10 minutes
            steps: [{action: core.log}]
        """
    )
    assert lines_of(problems) == [
        "harvest.yaml:4: phases[0].after: '10 minutes' is not a duration (write e.g. 30s, 10m, 1h30m)"
    ]


def test_nested_model_errors_reach_their_line() -> None:
    """Errors deep inside params and retry policies are located at their own keys."""
    problems = problems_of(
        """\
        id: x
        params:
          count:
            type: integer
        phases:
          - name: one
            steps:
              - action: core.log
                retry:
                  attempts: 0
        """
    )
    assert [(p.line, p.field) for p in problems] == [
        (4, "params.count.type"),
        (10, "phases[0].steps[0].retry.attempts"),
    ]


def test_unknown_with_key_is_refused_with_suggestion(registry: Registry) -> None:
    """A `with:` key the action's parameter model does not have is refused at its line."""
    text = HARVEST.replace('          count: "{{ count }}"', "          cuont: 4")
    problems = problems_of(text, reg=registry)
    assert lines_of(problems) == [
        "harvest.yaml:23: phases[1].steps[0].with.cuont: unknown field 'cuont' (did you mean 'count'?)"
    ]


def test_missing_with_key_is_placed_at_with(registry: Registry) -> None:
    """A required parameter that is absent is reported at the line of `with`."""
    text = HARVEST.replace("          lease: world.xp_rate\n", "")
    problems = problems_of(text, reg=registry)
    assert lines_of(problems) == ["harvest.yaml:25: phases[1].steps[1].with.lease: field required"]


def test_wrong_literal_type_in_with_is_refused(registry: Registry) -> None:
    """A literal value of the wrong type is refused when the file is loaded, not at run time."""
    text = HARVEST.replace('count: "{{ count }}"', "count: many")
    problems = problems_of(text, reg=registry)
    assert [(p.line, p.field) for p in problems] == [(23, "phases[1].steps[0].with.count")]
    assert "valid integer" in problems[0].message


def test_bad_literal_duration_in_with_is_refused(registry: Registry) -> None:
    """Action parameters typed as durations are checked at load time too."""
    text = HARVEST.replace("for: 1h", "for: soon")
    problems = problems_of(text, reg=registry)
    assert lines_of(problems) == [
        "harvest.yaml:28: phases[1].steps[1].with.for: 'soon' is not a duration (write e.g. 30s, 10m, 1h30m)"
    ]


def test_templated_value_is_validated_with_the_param_defaults(registry: Registry) -> None:
    """A template whose params all have defaults is rendered with them and type-checked."""
    text = HARVEST.replace('count: "{{ count }}"', 'count: "{{ creature }}"')
    problems = problems_of(text, reg=registry)
    assert [(p.line, p.field) for p in problems] == [(23, "phases[1].steps[0].with.count")]
    assert "valid integer" in problems[0].message


def test_templated_value_that_fits_with_defaults_passes(registry: Registry) -> None:
    """Arithmetic on a defaulted int param keeps the int, so the probe accepts it."""
    definition = load_definition(HARVEST.replace("{{ count }}", "{{ count * 2 }}"), "h.yaml", registry)
    assert definition.phases[1].steps[0].with_["count"] == "{{ count * 2 }}"


def test_templated_value_without_defaults_only_has_its_key_checked(registry: Registry) -> None:
    """`rate` has no default: its value cannot be typed yet, but a wrong key is still refused."""
    load_definition(HARVEST, "h.yaml", registry)
    problems = problems_of(HARVEST.replace('value: "{{ rate }}"', 'valeu: "{{ rate }}"'), reg=registry)
    assert lines_of(problems) == [
        "harvest.yaml:25: phases[1].steps[1].with.value: field required",
        "harvest.yaml:27: phases[1].steps[1].with.valeu: unknown field 'valeu' (did you mean 'value'?)",
    ]


def test_template_referencing_an_unknown_param_is_refused() -> None:
    """Templates may use only declared params, `params`, `event` and `run`."""
    text = HARVEST.replace("{{ creature }}", "{{ creatur }}").replace("{{ event.title }}", "{{ run.id }}")
    problems = problems_of(text)
    assert lines_of(problems) == [
        "harvest.yaml:22: phases[1].steps[0].with.creature: template uses unknown param 'creatur'"
        " (did you mean 'creature'?)"
    ]


def test_template_referencing_params_attribute_is_checked() -> None:
    """`params.x` names a param too, so a misspelled one is caught; dict methods are not params."""
    text = HARVEST.replace("{{ creature }}", "{{ params.cuont }}{{ params.items() | list }}")
    problems = problems_of(text)
    assert [p.message for p in problems] == ["template uses unknown param 'cuont' (did you mean 'count'?)"]


def test_template_syntax_error_is_placed_at_its_value() -> None:
    """A Jinja syntax error is a problem at the line of the value that holds it."""
    text = HARVEST.replace('"{{ creature }}"', '"{{ creature "')
    problems = problems_of(text)
    assert [(p.line, p.field) for p in problems] == [(22, "phases[1].steps[0].with.creature")]
    assert problems[0].message.startswith("template syntax error:")


def test_template_in_a_nested_list_is_located() -> None:
    """Templates inside lists in `with:` are checked and located by index."""
    text = HARVEST.replace('count: "{{ count }}"', 'tags: [a, "{{ missing }}"]')
    problems = problems_of(text)
    assert [(p.line, p.field) for p in problems] == [(23, "phases[1].steps[0].with.tags[1]")]


def test_unsafe_template_is_refused_at_load_time(registry: Registry) -> None:
    """A template the sandbox will always refuse is reported when the file is loaded."""
    text = HARVEST.replace('"{{ event.title }} begins"', "\"{{ ''.__class__.__mro__ }}\"")
    problems = problems_of(text, reg=registry)
    assert [p.field for p in problems] == ["phases[0].steps[0].with.message"]
    assert "sandbox" in problems[0].message


def test_reserved_param_name_is_refused() -> None:
    """A param called `run` would hide the run's own context from templates."""
    problems = problems_of(HARVEST.replace("  rate: {type: float}", "  rate: {type: float}\n  run: {type: str}"))
    assert lines_of(problems) == ["harvest.yaml:12: params.run: param name 'run' is reserved for templates"]


def test_yaml_syntax_error_names_its_line() -> None:
    """A YAML syntax error is one problem, at the line PyYAML points to."""
    problems = problems_of("id: x\nphases:\n  - name: one\n   steps: [\n")
    assert len(problems) == 1
    assert problems[0].line == 4
    assert problems[0].message.startswith("invalid YAML:")


def test_top_level_must_be_a_mapping() -> None:
    """A list, a scalar or an empty file is not an event definition."""
    assert problems_of("- a\n- b\n")[0].message == "an event definition must be a mapping, got a list"
    assert problems_of("")[0].message == "an event definition must be a mapping, got nothing"


def test_duplicate_key_is_a_problem() -> None:
    """A key written twice is reported at the second occurrence, naming the first."""
    problems = problems_of(
        """\
        id: x
        phases:
          - name: one
            steps:
              - action: core.log
                action: core.wait
        """
    )
    assert lines_of(problems) == [
        "harvest.yaml:6: phases[0].steps[0].action: duplicate key 'action' (first written on line 5)"
    ]


def test_merge_key_override_is_not_a_duplicate() -> None:
    """Overriding a key merged in with `<<` is ordinary YAML, not a duplicate."""
    text = """\
    id: x
    phases:
      - name: one
        steps:
          - &log {action: core.log, timeout: 5s}
          - <<: *log
            action: core.wait
    """
    definition = load_definition(textwrap.dedent(text), "x.yaml", None)
    assert [(s.action, s.timeout) for s in definition.phases[0].steps] == [("core.log", 5.0), ("core.wait", 5.0)]


JSON_EVENT = (
    "{\n"
    '\t"id": "x",\n'
    '\t"phases": [\n'
    '\t\t{"name": "one", "steps": [\n'
    '\t\t\t{"action": "world.spawn", "with": {"creature": "cow", "count": 1e2}},\n'
    '\t\t\t{"action": "ACTION", "with": {"creature": "cow"}}\n'
    "\t\t]}\n"
    "\t]\n"
    "}\n"
)


def test_json_lines_and_types(registry: Registry) -> None:
    """Lines of a JSON file point at the right key even with tab indentation."""
    problems = problems_of(JSON_EVENT.replace("ACTION", "world.spwan"), "x.json", registry)
    assert lines_of(problems) == [
        "x.json:6: phases[0].steps[1].action: unknown action 'world.spwan' (did you mean 'world.spawn'?)"
    ]
    extra = JSON_EVENT.replace("ACTION", "world.spawn").replace('"cow"}', '"cow", "x": 1}')
    problems = problems_of(extra, "x.json", registry)
    assert [(p.line, p.field, p.message) for p in problems] == [(6, "phases[0].steps[1].with.x", "unknown field 'x'")]


def test_json_numbers_mean_what_json_says(registry: Registry) -> None:
    """JSON is read by a JSON parser: `1e2` is the number 100, where YAML 1.1 reads a string."""
    definition = load_definition(JSON_EVENT.replace("ACTION", "world.spawn"), "x.json", registry)
    assert definition.phases[0].steps[0].with_["count"] == 100.0


def test_json_is_detected_by_its_opening_brace() -> None:
    """Text starting with `{` is read as JSON whatever its source is called: `1e2` is a number."""
    text = '{"id": "x",\n "title": 1e2,\n "phases": [{"name": "a", "steps": [{"action": "core.log"}]}]}'
    problems = problems_of(text, "api-upload")
    assert [(p.line, p.field, p.message) for p in problems] == [(2, "title", "Input should be a valid string")]


def test_duplicate_key_in_json_is_a_problem() -> None:
    """JSON parsers keep the last of two equal keys silently; the loader reports it."""
    problems = problems_of('{"id": "x",\n "phases": [],\n "phases": []}', "e.json")
    assert (3, "duplicate key 'phases' (first written on line 2)") in [(p.line, p.message) for p in problems]


def test_invalid_json_names_its_line() -> None:
    """A `.json` file that is not JSON is refused with the JSON parser's line."""
    problems = problems_of('{\n  "id": "x",\n  "phases": [,]\n}', "x.json")
    assert len(problems) == 1
    assert problems[0].line == 3
    assert problems[0].message.startswith("invalid JSON:")


def test_yaml_flow_mapping_is_still_yaml() -> None:
    """A YAML flow mapping starts with `{` too, and is read as YAML when it is not JSON."""
    definition = load_definition("{id: x, phases: [{name: a, steps: [{action: core.log}]}]}", "e", None)
    assert definition.id == "x"


def test_several_problems_are_reported_together_sorted_by_line(registry: Registry) -> None:
    """One load reports every mistake of a file, in the order of its lines."""
    text = """\
    id: Bad Id
    params:
      n: {type: int, default: 2}
    phases:
      - name: one
        steps:
          - action: world.spwan
          - action: world.spawn
            with: {creature: 3, count: "{{ n }}", extra: 1}
          - action: core.log
            timeout: forever
            with: {message: "{{ m }}"}
    """
    problems = problems_of(text, reg=registry)
    assert [(p.line, p.field) for p in problems] == [
        (1, "id"),
        (7, "phases[0].steps[0].action"),
        (9, "phases[0].steps[1].with.creature"),
        (9, "phases[0].steps[1].with.extra"),
        (11, "phases[0].steps[2].timeout"),
        (12, "phases[0].steps[2].with.message"),
    ]
    assert str(DefinitionError(problems)).count("\n") == len(problems) - 1


def test_alias_bomb_is_refused() -> None:
    """Aliases that expand into a huge document are refused instead of validated."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 8):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    problems = problems_of("\n".join(lines) + "\n")
    assert problems[0].message == "the document is too large once its aliases are expanded"


def test_load_file_reports_an_unreadable_file(tmp_path: Path) -> None:
    """A missing file is a DefinitionError naming it, not a bare OSError."""
    with pytest.raises(DefinitionError) as caught:
        load_file(tmp_path / "absent.yaml")
    assert caught.value.problems[0].source.endswith("absent.yaml")


def test_safe_loader_refuses_python_tags() -> None:
    """Python object tags are refused: event files may come from outside."""
    problems = problems_of("id: !!python/object/apply:os.system ['true']\nphases: []\n")
    assert problems[0].line == 1
    assert problems[0].message.startswith("invalid YAML:")


# --- rendering -------------------------------------------------------------------------------


def frozen(registry: Registry, given: dict[str, Any], text: str = HARVEST, run_id: int | None = 7) -> FrozenDefinition:
    definition = load_definition(text, "harvest.yaml", registry)
    return render(definition, definition.resolve_params(given), registry, run_id=run_id)


def test_render_keeps_native_types(registry: Registry) -> None:
    """A lone `{{ expr }}` keeps its type; text around an expression makes a string."""
    result = frozen(registry, {"count": "5", "rate": 2.5})
    spawn = result.phases[1].steps[0]
    assert spawn.params["count"] == 5
    assert result.phases[1].steps[1].params["value"] == 2.5
    assert result.phases[0].steps[0].params["message"] == "Harvest festival begins"


def test_render_keeps_lists_and_filters_become_lists(registry: Registry) -> None:
    """A list-valued expression, even a lazy filter result, arrives as a list."""
    text = HARVEST.replace('count: "{{ count }}"', "tags: \"{{ ['a', creature] | map('upper') }}\"")
    result = frozen(registry, {"rate": 1.0}, text)
    assert result.phases[1].steps[0].params["tags"] == ["A", "SHEEP"]


def test_render_validates_and_fills_defaults_keeping_aliases(registry: Registry) -> None:
    """Rendered params are the action model's dump: defaults filled in, `for` kept as written."""
    result = frozen(registry, {"rate": 1.5})
    spawn, lease = result.phases[1].steps
    assert spawn.params == {"creature": "sheep", "count": 3, "region": "britain", "tags": []}
    assert lease.params == {"lease": "world.xp_rate", "target": None, "value": 1.5, "for": 3600.0, "priority": None}
    assert result.phases[0].steps[0].params["level"] == "info"


def test_render_numbers_and_names_steps(registry: Registry) -> None:
    """Steps are numbered from 0 in their phase and default to the name `action#seq`."""
    result = frozen(registry, {"rate": 1.0})
    assert [(s.phase, s.seq, s.name) for s in result.phases[1].steps] == [
        (1, 0, "world.spawn#0"),
        (1, 1, "core.lease#1"),
    ]
    assert result.phases[1].after == 600.0
    assert result.params == {"count": 3, "creature": "sheep", "rate": 1.0}


def test_render_sees_run_and_event(registry: Registry) -> None:
    """Templates see `run.id`, `event.id` and the `params` mapping."""
    text = HARVEST.replace("{{ event.title }} begins", "{{ event.id }}/{{ run.id }}/{{ params.count }}")
    result = frozen(registry, {"rate": 1.0}, text, run_id=42)
    assert result.phases[0].steps[0].params["message"] == "harvest/42/3"


def test_render_refuses_a_bad_rendered_value(registry: Registry) -> None:
    """A value that renders to the wrong type is refused, naming its field, with the event id as source."""
    text = HARVEST.replace('"{{ creature }}"', "creature").replace('"{{ count }}"', '"{{ creature }}"')
    definition = load_definition(text.replace("default: sheep", "default: '7'"), "h.yaml", registry)
    with pytest.raises(DefinitionError) as caught:
        render(definition, definition.resolve_params({"creature": "wolf", "rate": 1.0}), registry)
    assert [(p.source, p.line, p.field) for p in caught.value.problems] == [
        ("harvest", None, "phases[1].steps[0].with.count")
    ]


def test_a_param_without_a_default_is_required(registry: Registry) -> None:
    """A param without a default must be given, even marked `required: false`: it was
    None, and a template using it failed naming no param. One given renders as before."""
    text = HARVEST.replace("    default: sheep\n", "    required: false\n")
    definition = load_definition(text, "h.yaml", registry)
    assert definition.params["creature"].required
    with pytest.raises(ValueError, match="param 'creature' is required: it has no default"):
        definition.resolve_params({"rate": 1.0})
    given = render(definition, definition.resolve_params({"rate": 1.0, "creature": "sheep"}), registry)
    assert given.phases[1].steps[0].params["creature"] == "sheep"


def test_render_refuses_unsafe_attribute_access(registry: Registry) -> None:
    """The sandbox refuses `''.__class__.__mro__` with a DefinitionError, never a crash."""
    text = HARVEST.replace('"{{ event.title }} begins"', "\"{{ ''.__class__.__mro__ }}\"")
    definition = load_definition(text, "h.yaml", None)
    with pytest.raises(DefinitionError) as caught:
        render(definition, definition.resolve_params({"rate": 1.0}), registry)
    (problem,) = caught.value.problems
    assert problem.field == "phases[0].steps[0].with.message"
    assert "unsafe" in problem.message


def test_render_refuses_unsafe_access_inside_text(registry: Registry) -> None:
    """The same refusal holds when the expression sits inside a larger string."""
    text = HARVEST.replace('"{{ event.title }} begins"', "\"x {{ ''.__class__.__subclasses__() }}\"")
    definition = load_definition(text, "h.yaml", None)
    with pytest.raises(DefinitionError) as caught:
        render(definition, definition.resolve_params({"rate": 1.0}), registry)
    assert "sandbox" in caught.value.problems[0].message


def test_render_refuses_huge_values(registry: Registry) -> None:
    """Arithmetic that would build an enormous value is refused by the sandbox."""
    text = HARVEST.replace('"{{ event.title }} begins"', "\"{{ 'x' * 10 ** 9 }}\"")
    definition = load_definition(text, "h.yaml", None)
    with pytest.raises(DefinitionError) as caught:
        render(definition, definition.resolve_params({"rate": 1.0}), registry)
    assert "too large" in caught.value.problems[0].message


def test_render_reports_a_failing_expression(registry: Registry) -> None:
    """A template that raises (division by zero) becomes a problem at its field."""
    text = HARVEST.replace('"{{ count }}"', '"{{ count // 0 }}"')
    definition = load_definition(text, "h.yaml", None)
    with pytest.raises(DefinitionError) as caught:
        render(definition, definition.resolve_params({"rate": 1.0}), registry)
    (problem,) = caught.value.problems
    assert problem.field == "phases[1].steps[0].with.count"
    assert "ZeroDivisionError" in problem.message


def test_render_refuses_unknown_action(registry: Registry) -> None:
    """An action that disappeared from the registry is refused when a run is rendered."""
    definition = load_definition(HARVEST.replace("world.spawn", "world.gone"), "h.yaml", None)
    with pytest.raises(DefinitionError) as caught:
        render(definition, definition.resolve_params({"rate": 1.0}), registry)
    assert [p.field for p in caught.value.problems] == ["phases[1].steps[0].action"]


def test_rendering_does_not_change_the_definition(registry: Registry) -> None:
    """The frozen copy keeps the definition with its templates untouched."""
    result = frozen(registry, {"rate": 1.0})
    assert result.event.phases[1].steps[0].with_["count"] == "{{ count }}"


def test_schedule_mistakes_are_reported_at_their_lines() -> None:
    """A `schedule:` is checked at load, each mistake at its line and field: a bad cron, an
    unknown time zone (with a suggestion), a one-shot time without an offset, params that do
    not fit the event's, and an unknown catch-up policy; a sound one loads, aware."""
    text = textwrap.dedent("""\
        id: patrol
        params:
          wave: {type: int, required: true}
        phases:
          - name: only
            steps:
              - action: core.log
                with: {message: hi}
        schedule:
          cron: "61 * * * *"
          timezone: Europe/Londn
          catch_up: sometimes
          params: {wave: 2, size: 3}
        """)
    with pytest.raises(DefinitionError) as caught:
        load_definition(text, "p.yaml", None)
    found = {(p.line, p.field): p.message for p in caught.value.problems}
    assert "not a cron expression" in found[(10, "schedule.cron")]
    assert "did you mean 'Europe/London'" in found[(11, "schedule.timezone")]
    assert "'latest', 'all' or 'none'" in found[(12, "schedule.catch_up")]

    bad_params = text.replace('"61 * * * *"', '"*/10 * * * *"').replace("Europe/Londn", "Europe/London")
    bad_params = bad_params.replace("sometimes", "all")
    with pytest.raises(DefinitionError) as caught:
        load_definition(bad_params, "p.yaml", None)
    [problem] = caught.value.problems
    assert (problem.line, problem.field) == (13, "schedule.params")
    assert "unknown param 'size'" in problem.message

    naive = text.split("schedule:")[0] + "schedule:\n  at: [2026-05-01T20:00:00Z, 2026-05-01 21:00:00]\n"
    naive += "  params: {wave: 1}\n"
    with pytest.raises(DefinitionError) as caught:
        load_definition(naive, "p.yaml", None)
    [problem] = caught.value.problems
    assert (problem.line, problem.field) == (10, "schedule.at[1]")
    assert "has no time zone" in problem.message

    sound = load_definition(naive.replace("2026-05-01 21:00:00", "2026-05-01T21:00:00+01:00"), "p.yaml", None)
    assert sound.schedule is not None
    assert sound.schedule.at is not None
    assert all(t.tzinfo is not None for t in sound.schedule.at)


def test_control_characters_are_a_problem_not_a_crash() -> None:
    """PyYAML's reader refuses control characters when the loader is built; that is
    reported like any other unreadable file (found by the API's schemathesis run)."""
    with pytest.raises(DefinitionError) as caught:
        load_definition("\x1f", "bad.yaml")
    assert str(caught.value).startswith("bad.yaml: invalid YAML: unacceptable character #x001f")


# --- what a start would refuse, refused when the file is checked -----------------------------

BORROW = """\
id: borrow
params:
  region: {type: str}
phases:
  - name: only
    steps:
      - action: core.lease
        timeout: 10s
        with: {WITH}
"""


@pytest.mark.parametrize(
    ("with_", "field", "message"),
    [
        ("{lease: world.nothing, value: 2}", "with.lease", "unknown lease 'world.nothing'"),
        ("{lease: world.weather, value: storm}", "with.target", "lease world.weather is targeted: say which target"),
        ("{lease: world.xp_rate, target: yew, value: 2}", "with.target", "lease world.xp_rate takes no target"),
        (
            "{lease: world.xp_rate, value: 2, priority: 3}",
            "with.priority",
            "lease world.xp_rate does not stack: a priority is only for a lease that stacks",
        ),
    ],
)
def test_a_borrow_a_start_would_refuse_is_refused_by_validate_and_by_render(
    registry: Registry, with_: str, field: str, message: str
) -> None:
    """A lease no module registers, a targeted lease without its target, a target for a
    lease that takes none, a priority for a lease that does not stack: each is refused
    when the file is checked, at its line, and (named through a param the check cannot
    know) when a run would start."""
    [problem] = problems_of(BORROW.replace("{WITH}", with_), reg=registry)
    assert (problem.line, problem.field, problem.message.split(" (did")[0]) == (
        9,
        f"phases[0].steps[0].{field}",
        message,
    )
    lease_name = with_.split("lease: ")[1].split(",")[0]
    late = BORROW.replace("{WITH}", with_.replace(f"lease: {lease_name}", 'lease: "{{ region }}"'))
    definition = load_definition(late, "borrow.yaml", registry)
    with pytest.raises(DefinitionError) as caught:
        render(definition, definition.resolve_params({"region": lease_name}), registry)
    [problem] = caught.value.problems
    assert (problem.field, problem.message.split(" (did")[0]) == (f"phases[0].steps[0].{field}", message)


def test_a_templated_target_is_left_to_the_start(registry: Registry) -> None:
    """A target written as a template is not known when the file is checked: the borrow
    passes, and the run's own params decide."""
    text = BORROW.replace("{WITH}", '{lease: world.weather, target: "{{ region }}", value: storm}')
    definition = load_definition(text, "borrow.yaml", registry)
    frozen = render(definition, definition.resolve_params({"region": "yew"}), registry)
    assert frozen.phases[0].steps[0].params["target"] == "yew"


def test_a_wait_as_long_as_its_timeout_is_refused(registry: Registry) -> None:
    """`core.wait for: 8s` under `timeout: 3s` could never finish: refused at its line
    when checked, and at the start when the wait comes from a param."""
    wait = """\
id: pause
params:
  hold: {type: str, default: 1s}
phases:
  - name: only
    steps:
      - action: core.wait
        timeout: 3s
        with: {for: FOR}
"""
    [problem] = problems_of(wait.replace("FOR", "8s"), reg=registry)
    assert (problem.line, problem.field) == (9, "phases[0].steps[0].with.for")
    assert problem.message.startswith("waits 8s, as long as or longer than the step's timeout (3s)")
    definition = load_definition(wait.replace("FOR", '"{{ hold }}"'), "pause.yaml", registry)
    assert render(definition, definition.resolve_params({}), registry).phases[0].steps[0].params["for"] == 1.0
    with pytest.raises(DefinitionError) as caught:
        render(definition, definition.resolve_params({"hold": "1m"}), registry)
    assert [p.field for p in caught.value.problems] == ["phases[0].steps[0].with.for"]


@pytest.mark.parametrize("given", ["nan", "inf", "-inf", float("nan"), float("inf")])
def test_a_number_param_must_be_finite(given: Any) -> None:
    """NaN passes every comparison with min and max, and infinity is no rate: both are
    refused, as text from a command line and as numbers from JSON."""
    spec = ParamSpec(type="float", min=0.5, max=5)
    with pytest.raises(ValueError, match="param 'rate' must be a finite number"):
        spec.coerce("rate", given)


def test_list_and_dict_params_are_given_as_json() -> None:
    """`-p waves='[3, 5]'` and `-p loot='{"gold": 2}'` arrive as text: read as JSON, and a
    text that is not JSON is refused saying how to write it."""
    assert ParamSpec(type="list").coerce("waves", "[3, 5]") == [3, 5]
    assert ParamSpec(type="dict").coerce("loot", '{"gold": 2}') == {"gold": 2}
    with pytest.raises(ValueError, match=r"param 'waves' must be list \(write it as JSON\)"):
        ParamSpec(type="list").coerce("waves", "3, 5")
    with pytest.raises(ValueError, match=r"param 'loot' must be dict, got \[1\]"):
        ParamSpec(type="dict").coerce("loot", "[1]")


NESTED = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}done"


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{ 'a'.ljust(10**8) }}", "template refused by the sandbox: 100000000 is too large an argument for ljust()"),
        (
            "{% for i in range(9999) %}{{ 'a' * 999 }}{% endfor %}",
            "template refused by the sandbox: the template writes more than 1,000,000 characters",
        ),
        (NESTED, "templates took longer than 2s to render"),
    ],
)
def test_a_template_is_bounded_in_size_and_time(registry: Registry, template: str, message: str) -> None:
    """A template that would pad a string to 100 MB, write out 10 MB, or loop 10^10 times
    is refused when the file is checked, at its step, well before it hurts anything."""
    text = f"""\
id: heavy
phases:
  - name: only
    steps:
      - action: core.log
        with: {{message: "{template}"}}
"""
    [problem] = problems_of(text, reg=registry)
    assert problem.field.startswith("phases[0].steps[0].with")
    assert problem.message == message


BIG = '{% set a = "x" * 1000000 %}'


@pytest.mark.parametrize(
    ("template", "refused"),
    [
        ('{{ "x" | center(999999999) }}', "center()"),
        (
            BIG + "{{ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a }}",
            "the result of '~'",
        ),
        (BIG + "{% set b = a ~ a ~ a %}{% set c = b ~ b ~ b %}{{ c | length }}", "the result of '~'"),
        (BIG + "{{ (a + a + a) | length }}", "the result of '+'"),
        ('{{ "%0999999999d" % 1 }}', "the result of '%'"),
        ('{{ "%0999999999d" | format(1) }}', "the result of '%'"),
        ('{{ "{:999999999}".format(1) }}', "the result of format()"),
        ('{{ ("x\n" * 500000) | indent(1000000) | length }}', "indent()"),
        ('{{ ("x" * 1000000) | replace("x", "yyyyyyyyyy") | length }}', "replace()"),
        ('{{ ("x" * 1000000).replace("x", "yyyyyyyyyy") | length }}', "replace()"),
        ('{{ range(100000) | join("y" * 100) | length }}', "join()"),
        ('{{ (["x" * 1000000] * 1000) | length }}', "the result of '*'"),
        ('{{ ("\t" * 100000).expandtabs(1000000) | length }}', "expandtabs()"),
        ("{% set l = [1] %}{% for i in range(40) %}{% set _ = l.extend(l) %}{% endfor %}{{ l | length }}", "extend()"),
        (
            '{% set b %}{% for i in range(100000) %}{{ "x" * 20 }}{% endfor %}{% endset %}{{ b | length }}',
            "a block's text",
        ),
        ("{{ [range(100000) | list] * 20 }}", "the result of '*'"),
        ("{{ range(100000) | list | tojson(indent=100) | length }}", "tojson()"),
        ("{{ range(10) | batch(999999999, 'x') | list }}", "batch()"),
        ("{{ lipsum(1000000) | length }}", "lipsum() writes at most 100,000 words"),
        ("{{ (10 ** 1000) ** 1000 }}", "the result of '**' would be too large a number"),
    ],
)
def test_whatever_builds_a_value_is_bounded_before_it_is_built(registry: Registry, template: str, refused: str) -> None:
    """Each way a template can build a gigabyte from a line (padding, repeating, joining,
    inserting, formatting with a width, a block's buffer, a list of long strings made
    text) is refused before the value is made, within a second and a few megabytes, as
    `file:line: field: message`. Before, `center(999999999)` took 4.5 s and 1 GB until
    the time limit stopped it, and a `~` chain of 300 M characters was accepted."""
    text = "id: heavy\nparams:\n  n: {type: int, default: 3}\nphases:\n  - name: only\n    steps:\n"
    text += f"      - action: core.log\n        with: {{message: {json.dumps(template)}}}\n"
    problems = problems_of(text, "heavy.yaml", registry)
    assert [str(p).split(": template refused by the sandbox: ")[0] for p in problems] == [
        "heavy.yaml:8: phases[0].steps[0].with.message"
    ]
    assert refused in problems[0].message
    # Again with Python's allocations traced.
    tracemalloc.start()
    try:
        problems_of(text, "heavy.yaml", registry)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20, f"peaked at {peak / 2**20:.0f} MiB"


def test_the_bounds_are_met_when_a_run_starts_too(registry: Registry) -> None:
    """A template fed by a param without a default passes the check, and is refused when a
    run gives it a value that would build too much, naming the step."""
    text = """\
id: padded
params:
  width: {type: int}
phases:
  - name: only
    steps:
      - action: core.log
        with: {message: "{{ 'x' | center(width) ~ 'y' * width }}"}
"""
    definition = load_definition(text, "padded.yaml", registry)
    fine = render(definition, definition.resolve_params({"width": 3}), registry)
    assert fine.phases[0].steps[0].params["message"] == " x yyy"
    tracemalloc.start()
    try:
        with pytest.raises(DefinitionError) as caught:
            render(definition, definition.resolve_params({"width": 999_999_999}), registry)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20, f"peaked at {peak / 2**20:.0f} MiB"  # refused before it was built
    assert [str(p) for p in caught.value.problems] == [
        "padded: phases[0].steps[0].with.message: template refused by the sandbox: "
        "center() would come to more than 1,000,000 characters"
    ]


@pytest.mark.parametrize(
    ("template", "value"),
    [
        (
            "{{ 'x' | center(5) ~ '|' ~ 'ab' * 2 ~ '|' ~ ('%03d' % 7) ~ '|' ~ '{:>4}'.format('z') }}",
            "  x  |abab|007|   z",
        ),
        ("{{ [1, 2] + [3] }}", [1, 2, 3]),
        ("{{ [[1], [2, 3]] | sum(start=[]) }}", [1, 2, 3]),
        ("{{ [1, 2, 3] | sum }}", 6),
        ("{{ ['a', 'b'] | join(', ') }}|{{ 'a-b' | replace('-', '+') }}|{{ 'a\nb' | indent(2) }}", "a, b|a+b|a\n  b"),
        ("{{ {'a': [1]} | tojson(indent=2) }}", '{\n  "a": [\n    1\n  ]\n}'),
        (
            "{% set ns = namespace(l=[]) %}{% for i in range(3) %}{% set _ = ns.l.append(i) %}{% endfor %}{{ ns.l }}",
            "[0, 1, 2]",
        ),
        ("{% macro m(x) %}<{{ x }}>{% endmacro %}{{ m(1) ~ m(2) }}", "<1><2>"),
        ("{% set b %}{% for i in range(3) %}{{ i }}{% endfor %}{% endset %}{{ b ~ b }}", "012012"),
        ("{{ 2 ** 10 * 3 }}", 3072),
        ("{{ ('x' * 1000000) | length }}", 1_000_000),
    ],
)
def test_templates_within_the_bounds_render_as_before(template: str, value: Any) -> None:
    assert render_string(template, {}) == value


def _one_step(template: str) -> str:
    text = "id: once\nparams:\n  n: {type: int, default: 3}\n  r: {type: str}\nphases:\n  - name: only\n"
    return text + f"    steps:\n      - action: core.log\n        with: {{message: {json.dumps(template)}}}\n"


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            "{% for i in range(100000000) %}x{{ r }}{% endfor %}",
            "template failed: OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).",
        ),
        ("{{ 1 // 0 }} {{ n }}", "template failed: ZeroDivisionError: integer division or modulo by zero"),
        ("{{ run.nope }}", "template failed: 'dict object' has no attribute 'nope'"),
    ],
)
def test_a_template_that_fails_for_every_run_is_refused_at_validation(
    registry: Registry, template: str, message: str
) -> None:
    """A template that fails before it looks at a param fails for every run: validation
    says so, as `file:line: field: message`, with the error a run would meet. Before,
    only the sandbox's refusals were reported, and such a file passed `event validate`
    and `event apply` and then refused every `run start`."""
    problems = problems_of(_one_step(template), "once.yaml", registry)
    assert [str(p) for p in problems] == [f"once.yaml:9: phases[0].steps[0].with.message: {message}"]


@pytest.mark.parametrize(
    "template",
    ["{{ 10 // (n - 3) }}", "{% if n > 2 %}{{ 1 // 0 }}{% endif %}", "{{ r.upper() }}", "{{ (params.n - 3) // 0 }}"],
)
def test_a_template_that_fails_for_some_values_only_still_validates(registry: Registry, template: str) -> None:
    """Failing with the params' defaults (or without a value) is not failing for every
    run: a template that looks at a param before it fails may succeed with another."""
    definition = load_definition(_one_step(template), "some.yaml", registry)
    assert definition.id == "once"


def test_a_slow_template_is_refused_when_the_run_starts(registry: Registry) -> None:
    """The same loops fed by a param without a default pass the check (it cannot render
    them) and are stopped when a run would start, naming the step."""
    text = """\
id: heavy
params:
  n: {type: int}
phases:
  - name: only
    steps:
      - action: core.log
        with: {message: "{% for i in range(n) %}{% for j in range(n) %}{% endfor %}{% endfor %}done"}
"""
    definition = load_definition(text, "heavy.yaml", registry)
    assert (
        render(definition, definition.resolve_params({"n": 3}), registry).phases[0].steps[0].params["message"] == "done"
    )
    with pytest.raises(DefinitionError) as caught:
        render(definition, definition.resolve_params({"n": 99999}), registry)
    assert [str(p) for p in caught.value.problems] == [
        "heavy: phases[0].steps[0].with: templates took longer than 2s to render"
    ]


def test_a_run_is_bounded_in_what_its_steps_hold_in_all(registry: Registry) -> None:
    """Each value is bounded, but many steps of a large value each would render gigabytes
    for the database to store and the workers to dispatch: a run whose steps come to more
    than 16 million characters is refused at the step that crosses the bound, when the
    file is checked (from the defaults) and when a run starts (from its params)."""
    text = (
        """\
id: big
params:
  n: {type: int, default: 10}
phases:
  - name: only
    steps:
"""
        + "      - {action: core.log, with: {message: \"{{ 'a' * n * 1000 }}{{ 'b' * n * 1000 }}\"}}\n" * 20
    )
    definition = load_definition(text, "big.yaml", registry)
    assert len(render(definition, definition.resolve_params({"n": 390}), registry).phases[0].steps) == 20
    with pytest.raises(DefinitionError) as caught:
        render(definition, definition.resolve_params({"n": 450}), registry)
    [problem] = caught.value.problems
    assert problem.field == "phases[0].steps[17].with"
    assert "more than 16,000,000 characters of parameters" in problem.message
    [problem] = problems_of(text.replace("default: 10", "default: 450"), reg=registry)
    assert problem.field == "phases[0].steps[17].with"


def test_a_long_file_without_aliases_is_not_taken_for_an_alias_bomb() -> None:
    """20,001 steps written out (about 1.4 MB) were refused as "too large once its aliases
    are expanded" though the file has no alias; they load."""
    steps = "".join(f"      - action: core.log\n        with: {{message: 'line {i}'}}\n" for i in range(20_001))
    text = f"id: long\nphases:\n  - name: only\n    steps:\n{steps}"
    assert len(text) > 1_000_000
    definition = load_definition(text, "long.yaml", None)
    assert len(definition.phases[0].steps) == 20_001


def test_what_is_copied_into_every_run_is_bounded() -> None:
    """A 30 MB file is refused before it is parsed, and a description longer than 20,000
    characters at its line (it is copied into every run)."""
    [problem] = problems_of("id: big\ndescription: " + "x" * 30_000_000 + "\nphases: []\n")
    assert problem.message.startswith("the file is too large: 30,000,033 characters, more than the 4,000,000")
    [problem] = problems_of(
        "id: big\ndescription: " + "x" * 20_001 + "\nphases:\n  - name: a\n    steps: [{action: core.log}]\n"
    )
    assert (problem.line, problem.field) == (2, "description")


def test_a_lease_value_the_lease_does_not_take_is_refused_by_validate_and_at_the_start(tmp_path: Path) -> None:
    """Before: `value: fast` for a rate passed `event validate`, and every run failed at
    its borrow when the world refused it. A lease that says what it takes (the sandbox's
    rate: a number, at least 0) has a value of another kind refused at its line, and one
    that a template makes refused when a run would start."""
    registry = build_registry({"sandbox": {"db": str(tmp_path / "world.db")}})
    rates = """\
id: rates
params:
  rate: {type: float}
phases:
  - name: only
    steps:
      - action: core.lease
        with: {lease: sandbox.xp_rate, value: VALUE}
"""
    [problem] = problems_of(rates.replace("VALUE", "fast"), reg=registry)
    assert (problem.line, problem.field) == (8, "phases[0].steps[0].with.value")
    assert problem.message == "lease sandbox.xp_rate takes no such value: 'fast' is not of type 'number'"
    assert problems_of(rates.replace("VALUE", "true"), reg=registry)  # a yes/no is no number
    definition = load_definition(rates.replace("VALUE", '"{{ rate * -1 }}"'), "rates.yaml", registry)
    with pytest.raises(DefinitionError) as caught:
        render(definition, definition.resolve_params({"rate": 2}), registry)
    [late] = caught.value.problems
    assert late.field == "phases[0].steps[0].with.value"
    assert "less than the minimum of 0" in late.message
    good = load_definition(rates.replace("VALUE", '"{{ rate }}"'), "rates.yaml", registry)
    assert render(good, good.resolve_params({"rate": 2}), registry).phases[0].steps[0].params["value"] == 2.0
