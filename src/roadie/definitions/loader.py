"""Read an event file (YAML or JSON) into a validated `EventDefinition`, or say every mistake.

Every problem names its file, line and field (`harvest.yaml:14: phases[1].steps[0].action:
unknown action 'world.spwan' (did you mean 'world.spawn'?)`), and a file is reported whole:
an operator fixes five mistakes in one edit, not in five runs of the loader.

Lines come from the YAML node tree, which PyYAML keeps until the document is constructed:
each field path is mapped to the line of its key (or, in a list, of its item), and an
error is placed at the deepest part of its path the file actually contains.
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Mapping
from typing import Any

import yaml
from jinja2 import meta, nodes
from jinja2.exceptions import SecurityError, TemplateSyntaxError
from pydantic import ValidationError

from roadie.definitions.model import EventDefinition, ParamSpec, StepDef
from roadie.definitions.render import (
    MAX_RUN_CHARACTERS,
    RENDER_SECONDS,
    RESERVED_NAMES,
    RUN_TOO_LARGE,
    FieldPath,
    TemplateFailure,
    accepted_keys,
    describe_template_error,
    error_message,
    field_path,
    has_template,
    json_size,
    render_string,
    render_value,
    step_rules,
    suggest,
    template_context,
    template_strings,
    within,
)
from roadie.definitions.sandbox import ENV
from roadie.definitions.yaml_errors import explain
from roadie.durations import parse_duration
from roadie.errors import DefinitionError, Problem, UnknownAction
from roadie.registry.module import Action
from roadie.registry.registry import Registry

Lines = dict[FieldPath, int]

# A file of a few hundred lines can name one anchor a billion times over ("billion
# laughs"): aliases may not make the document more than `_MAX_GROWTH` times what is
# written, past `_MAX_NODES`. What is written is bounded by the file's size.
_MAX_NODES = 100_000
_MAX_GROWTH = 4
MAX_TEXT = 4_000_000
"""The largest event file, in characters: its text is stored with every version."""
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Refused(Exception):
    """The file cannot be read at all; carries the one problem that says why."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


def load_file(path: str | os.PathLike[str], registry: Registry | None = None) -> EventDefinition:
    """Read and validate the event file at `path`; the path as given names it in problems."""
    source = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DefinitionError([Problem(source, None, "", f"cannot read the file: {exc}")]) from exc
    return load_definition(text, source, registry)


def load_definition(text: str, source: str, registry: Registry | None = None) -> EventDefinition:
    """Parse and validate one event definition, or raise one DefinitionError naming every problem.

    The text is JSON when `source` ends with `.json` or the text is a JSON object, and
    YAML otherwise. Structure is checked by `EventDefinition`; templates in `with:` are
    checked for syntax and for names the event does not declare. With a `registry`, each
    step's action must exist and its `with:` must fit the action's parameter model: literal
    values are validated as they are, templated ones with the params' defaults when every
    name they use has one, and otherwise only their key is checked.
    """
    if len(text) > MAX_TEXT:
        size = f"{len(text):,} characters, more than the {MAX_TEXT:,} an event file may hold"
        raise DefinitionError([Problem(source, None, "", f"the file is too large: {size}")])
    try:
        data, lines, problems = _parse(text, source)
    except _Refused as refused:
        raise DefinitionError([refused.problem]) from None
    if not isinstance(data, dict):
        got = "nothing" if data is None else f"a {type(data).__name__}"
        problem = Problem(source, lines.get((), 1), "", f"an event definition must be a mapping, got {got}")
        raise DefinitionError([problem])

    definition: EventDefinition | None = None
    try:
        definition = EventDefinition.model_validate(data)
    except ValidationError as exc:
        for error in exc.errors():
            loc = tuple(error["loc"])
            problems.append(Problem(source, _line(lines, loc), field_path(loc), error_message(error, EventDefinition)))
    # The raw data, not the model, drives the step checks: they still run on the steps
    # that are well formed when others are not, so one report holds every mistake.
    problems.extend(_Checker(data, source, lines, registry).bounded_problems())

    if problems or definition is None:
        problems.sort(key=lambda p: (p.line is None, p.line or 0))
        raise DefinitionError(problems)
    return definition


def parse_with_lines(text: str, source: str) -> tuple[Any, Lines]:
    """A YAML (or JSON) document and the line of each of its fields, for other files that
    are checked as event files are (console definitions); raises DefinitionError when
    the text cannot be parsed at all."""
    try:
        data, lines, problems = _parse(text, source)
    except _Refused as refused:
        raise DefinitionError([refused.problem]) from None
    if problems:
        raise DefinitionError(problems)
    return data, lines


def line_of(lines: Mapping[FieldPath, int], path: FieldPath) -> int | None:
    """The line of the deepest part of `path` present in the file."""
    return _line(lines, path)


def _line(lines: Mapping[FieldPath, int], path: FieldPath) -> int | None:
    """The line of the deepest part of `path` present in the file."""
    for end in range(len(path), -1, -1):
        line = lines.get(path[:end])
        if line is not None:
            return line
    return None


# --- parsing -------------------------------------------------------------------------------


def _parse(text: str, source: str) -> tuple[Any, Lines, list[Problem]]:
    """The document's data, its line map, and the problems only the node tree shows."""
    as_json = source.lower().endswith(".json")
    json_data: Any = None
    if as_json or text.lstrip().startswith("{"):
        try:
            json_data = json.loads(text)
            as_json = True
        except json.JSONDecodeError as exc:
            if as_json:
                raise _Refused(Problem(source, exc.lineno, "", f"invalid JSON: {exc.msg}")) from exc
            # A YAML flow mapping (`{id: x, ...}`) also starts with `{`: read it as YAML.

    if as_json:
        # JSON is read by the json module, so its numbers and escapes mean what JSON says
        # (YAML 1.1 reads `1e5` as a string); YAML only supplies the lines. YAML refuses
        # tabs between tokens, and JSON allows a tab nowhere else, so spaces keep every line.
        try:
            _, lines, problems = _compose(text.replace("\t", " "), source)
        except _Refused:
            lines, problems = {}, []
        return json_data, lines, problems
    return _compose(text, source)


def _compose(text: str, source: str) -> tuple[Any, Lines, list[Problem]]:
    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:  # the reader refuses control characters before any parsing
        raise _Refused(Problem(source, None, "", f"invalid YAML: {exc}")) from exc
    try:
        root = loader.get_single_node()
        if root is None:
            return None, {}, []
        problems: list[Problem] = []
        _check_size(root, source)
        _find_duplicates(loader, root, (), source, problems, set())
        data = loader.construct_document(root)
        lines: Lines = {(): root.start_mark.line + 1}
        _map_lines(loader, root, (), lines, set())
    except yaml.MarkedYAMLError as exc:
        said = explain(exc, text)
        raise _Refused(Problem(source, said.line, said.field, said.message)) from exc
    except yaml.YAMLError as exc:
        raise _Refused(Problem(source, None, "", f"invalid YAML: {exc}")) from exc
    except RecursionError as exc:
        raise _Refused(Problem(source, None, "", "the document is nested too deeply")) from exc
    except (ValueError, TypeError, OverflowError) as exc:
        # PyYAML lets some scalars fail with plain Python errors (a date like 2024-13-45).
        raise _Refused(Problem(source, None, "", f"invalid YAML value: {exc}")) from exc
    finally:
        loader.dispose()
    return data, lines, problems


def _key(loader: yaml.SafeLoader, node: yaml.Node) -> Hashable | None:
    """A mapping key's value, as construction will make it; None for keys that are not scalars."""
    if not isinstance(node, yaml.ScalarNode):
        return None
    try:
        value = loader.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError):
        return None
    return value if isinstance(value, Hashable) else None


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_size(root: yaml.Node, source: str) -> None:
    """Refuse a document whose aliases expand it past `_MAX_NODES` and `_MAX_GROWTH` times
    the nodes written, or refer to themselves. A long file without aliases is not
    refused here: 20,000 steps are 20,000 steps."""
    written = _count_written(root)
    limit = max(_MAX_NODES, _MAX_GROWTH * written)
    sizes: dict[int, int] = {}
    # An explicit stack, so that the check itself cannot be driven into deep recursion.
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, done = stack.pop()
        if done:
            open_nodes.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[id(node)] > limit:
                line = node.start_mark.line + 1
                raise _Refused(Problem(source, line, "", "the document is too large once its aliases are expanded"))
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_nodes:
            line = node.start_mark.line + 1
            raise _Refused(Problem(source, line, "", "an alias refers to the node that contains it"))
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


def _count_written(root: yaml.Node) -> int:
    """The distinct nodes of a document, each alias's target counted once."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            stack.extend(_children(node))
    return len(seen)


def _find_duplicates(
    loader: yaml.SafeLoader,
    node: yaml.Node,
    path: FieldPath,
    source: str,
    problems: list[Problem],
    seen: set[int],
) -> None:
    """Report every key written twice in one mapping, which PyYAML would silently collapse.

    Runs before construction, because merging `<<` keys rewrites the node tree, and an
    override of a merged key is not a duplicate.
    """
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[Hashable, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = _key(loader, key_node)
            line = key_node.start_mark.line + 1
            child: FieldPath = (*path, key) if isinstance(key, str | int) else path
            if key is not None and key in first:
                message = f"duplicate key {key!r} (first written on line {first[key]})"
                problems.append(Problem(source, line, field_path(child), message))
            elif key is not None:
                first[key] = line
            _find_duplicates(loader, value_node, child, source, problems, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _find_duplicates(loader, item, (*path, index), source, problems, seen)


def _map_lines(loader: yaml.SafeLoader, node: yaml.Node, path: FieldPath, lines: Lines, seen: set[int]) -> None:
    """Record the line of every key and list item below `node`.

    A node reached again through an alias is not walked twice: its fields are placed at
    the alias, which is where the operator wrote them into this path.
    """
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = _key(loader, key_node)
            if not isinstance(key, str | int):
                continue
            # The last occurrence wins, as it does in the constructed data.
            lines[(*path, key)] = key_node.start_mark.line + 1
            _map_lines(loader, value_node, (*path, key), lines, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[(*path, index)] = item.start_mark.line + 1
            _map_lines(loader, item, (*path, index), lines, seen)


# --- the checks that need more than the structure ------------------------------------------


class _Checker:
    """The checks of templates and of `with:` against the registry, on the raw data."""

    def __init__(self, data: dict[Any, Any], source: str, lines: Lines, registry: Registry | None) -> None:
        self.data = data
        self.source = source
        self.lines = lines
        self.registry = registry
        self.found: list[Problem] = []
        raw_params = data.get("params")
        self.params: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
        self.param_names = [str(name) for name in self.params]
        self.allowed = set(self.param_names) | RESERVED_NAMES | set(ENV.globals)
        self.at: FieldPath = ()  # the step being checked, for a check that runs out of time
        self.size = 0  # what the steps' values checked so far come to, as JSON characters

    def bounded_problems(self) -> list[Problem]:
        """The problems found, the probes' rendering bounded in time as a run's is."""
        found = within(RENDER_SECONDS, self.problems)
        if found is None:
            self._add(self.at, f"templates took longer than {RENDER_SECONDS:g}s to render")
            return self.found
        return found

    def problems(self) -> list[Problem]:
        self._check_param_names()
        phases = self.data.get("phases")
        for i, phase in enumerate(phases if isinstance(phases, list) else []):
            steps = phase.get("steps") if isinstance(phase, dict) else None
            for j, step in enumerate(steps if isinstance(steps, list) else []):
                if isinstance(step, dict):
                    self._check_step(("phases", i, "steps", j), step)
        return self.found

    def _add(self, path: FieldPath, message: str) -> None:
        self.found.append(Problem(self.source, _line(self.lines, path), field_path(path), message))

    def _check_param_names(self) -> None:
        for name in self.param_names:
            if name in RESERVED_NAMES:
                self._add(("params", name), f"param name {name!r} is reserved for templates")

    def _probe_context(self) -> dict[str, Any]:
        """The context a load-time probe renders with: params that have a default, no run.

        A name without a default is left undefined, so a template using it fails to
        render and is then only checked by key, as the loader promises.
        """
        defaults: dict[str, Any] = {}
        for name, raw in self.params.items():
            try:
                spec = ParamSpec.model_validate(raw)
            except ValidationError:
                continue
            if spec.default is not None:
                defaults[str(name)] = spec.default
        event_id, title = self.data.get("id"), self.data.get("title")
        context = template_context(
            defaults,
            event_id=event_id if isinstance(event_id, str) else "",
            title=title if isinstance(title, str) else "",
            run_id=None,
        )
        del context["run"]
        return context

    def _failure_for_every_run(self, value: Any, path: FieldPath) -> Exception | None:
        """How the template at `path` inside `value` fails whatever the run's params are,
        or None: rendered with every param (and the run's id) an `_Unknown`, it fails
        before it has done anything with one, as every run would. A template that looks
        at a param first is not judged here: it may fail for one value and not another."""
        text = dict(template_strings(value, path[:1])).get(path)
        if text is None:
            return None
        try:
            render_string(text, self._unknown_context())
        except _DependsOnParam:
            return None
        except Exception as exc:  # the template's own failure, whatever it is
            return exc
        return None

    def _unknown_context(self) -> dict[str, Any]:
        event_id, title = self.data.get("id"), self.data.get("title")
        context = template_context(
            dict.fromkeys(self.param_names, UNKNOWN),
            event_id=event_id if isinstance(event_id, str) else "",
            title=title if isinstance(title, str) else "",
            run_id=None,
        )
        context["run"] = {"id": UNKNOWN}
        return context

    def _check_step(self, where: FieldPath, step: dict[Any, Any]) -> None:
        with_key = "with" if "with" in step or "with_" not in step else "with_"
        raw_with = step.get(with_key, {})
        with_path: FieldPath = (*where, with_key)
        self.at = with_path
        templates_ok = self._check_templates(with_path, raw_with)

        action_id = step.get("action")
        if self.registry is None or not isinstance(action_id, str) or "." not in action_id:
            # Without a registry there is nothing to check against; a name without a dot
            # is already reported by the model, and a lookup would only say it again.
            return
        try:
            action = self.registry.action(action_id)
        except UnknownAction as exc:
            self._add((*where, "action"), exc.message)
            return
        if isinstance(raw_with, dict):
            self._check_with(with_path, action, raw_with, templates_ok, _timeout(step))

    def _check_templates(self, with_path: FieldPath, raw_with: Any) -> set[Any]:
        """Report bad syntax and undeclared names; the `with:` keys whose templates are sound."""
        if not isinstance(raw_with, dict):
            return set()
        sound: set[Any] = set()
        for key, value in raw_with.items():
            ok = True
            for sub, text in template_strings(value, (key,)):
                path = (*with_path, *sub)
                try:
                    tree = ENV.parse(text)
                except TemplateSyntaxError as exc:
                    self._add(path, describe_template_error(exc))
                    ok = False
                    continue
                for name in sorted(_referenced(tree) - self.allowed):
                    self._add(path, f"template uses unknown param {name!r}{suggest(name, self.param_names)}")
                    ok = False
            if ok:
                sound.add(key)
        return sound

    def _check_with(
        self, with_path: FieldPath, action: Action, raw_with: dict[Any, Any], sound: set[Any], timeout: float | None
    ) -> None:
        model = action.params
        accepted = accepted_keys(model)
        forbids_extra = model.model_config.get("extra") == "forbid"
        context = self._probe_context()
        probe: dict[Any, Any] = {}
        unchecked: set[str] = set()
        for key, value in raw_with.items():
            if not has_template(value):
                probe[key] = value
                continue
            if key in sound:
                try:
                    probe[key] = render_value(value, context, (key,))
                    continue
                except TemplateFailure as failure:
                    # The sandbox's refusals with the defaults, and whatever fails before a
                    # param is looked at, every run would meet: say so now.
                    if isinstance(failure.error, SecurityError):
                        self._add((*with_path, *failure.path), str(failure))
                    elif (everyone := self._failure_for_every_run(value, failure.path)) is not None:
                        self._add((*with_path, *failure.path), str(TemplateFailure(failure.path, everyone)))
            # Not renderable before the run's params are known: only its key is checked.
            if key in accepted:
                unchecked.update({key, accepted[key]})
            elif forbids_extra:
                message = f"unknown field {key!r}{suggest(str(key), sorted(set(accepted.values())))}"
                self._add((*with_path, key), message)
        try:
            model.model_validate(probe)
        except ValidationError as exc:
            for error in exc.errors():
                loc = tuple(error["loc"])
                if (not loc and unchecked) or (loc and loc[0] in unchecked):
                    # About a value we left out, or a rule spanning values we cannot
                    # know yet: `render` checks it when the run is created.
                    continue
                self._add((*with_path, *loc), error_message(error, model))
        except Exception as exc:
            self._add(with_path, f"invalid parameters: {exc}")
            return
        assert self.registry is not None  # checked by the caller
        known = {str(key): value for key, value in probe.items()}
        over = self.size > MAX_RUN_CHARACTERS
        self.size += json_size(known)
        if not over and self.size > MAX_RUN_CHARACTERS:
            self._add(with_path, RUN_TOO_LARGE)
        for path, message in step_rules(self.registry, action, known, timeout, unchecked):
            self._add((*with_path, *path), message)


class _DependsOnParam(BaseException):
    """Raised by `UNKNOWN` when a template does anything with it. A BaseException, so that
    no handler of a template or of the filters it calls takes it for the template's error."""


class _Unknown:
    """A param whose value is not known yet: whatever a template does with it (print it,
    compare it, add to it, call a method of it, iterate it) raises `_DependsOnParam`."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        raise _DependsOnParam()


def _depends(self: _Unknown, *args: Any, **kwargs: Any) -> Any:
    raise _DependsOnParam()


_OPERATIONS = (
    "str repr format bytes bool len iter reversed contains getitem hash eq ne lt le gt ge call "
    "add radd sub rsub mul rmul truediv rtruediv floordiv rfloordiv mod rmod pow rpow divmod rdivmod "
    "neg pos abs invert int float complex index round trunc floor ceil and rand or ror xor rxor"
)
for _name in _OPERATIONS.split():
    setattr(_Unknown, f"__{_name}__", _depends)

UNKNOWN = _Unknown()


def _timeout(step: dict[Any, Any]) -> float | None:
    """The step's timeout as written, or its default; None when it is not a duration (the
    model says why)."""
    try:
        return parse_duration(step.get("timeout", StepDef.model_fields["timeout"].default))
    except ValueError:
        return None


def _referenced(tree: nodes.Template) -> set[str]:
    """Top-level names a template reads, plus `x` of every `params.x` and `params['x']`.

    `params.items()` and the other dict methods are not names of params.
    """
    names = set(meta.find_undeclared_variables(tree))
    for attr in tree.find_all(nodes.Getattr):
        if _is_params(attr.node) and not hasattr(dict, attr.attr):
            names.add(attr.attr)
    for item in tree.find_all(nodes.Getitem):
        if _is_params(item.node) and isinstance(item.arg, nodes.Const) and isinstance(item.arg.value, str):
            names.add(item.arg.value)
    return names


def _is_params(node: nodes.Node) -> bool:
    return isinstance(node, nodes.Name) and node.name == "params"


__all__ = ["load_definition", "load_file"]
