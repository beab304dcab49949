"""The first rule: the module's manifest is valid, and names what `--params`, `--target`
and `--value` name. It chooses the ledger action the later rules dispatch."""

from __future__ import annotations

import json

from pydantic import ValidationError

from roadie import protocol
from roadie.conformance.params import check_schema, example_params, invalid
from roadie.conformance.session import Failed, Session, first_error, message_of


async def check_manifest(s: Session) -> str:
    status, answer = await s.ask("manifest", None)
    if status != 200:
        raise Failed(f"GET {protocol.MANIFEST} answered {status}: {message_of(answer)}")
    try:
        manifest = protocol.Manifest.model_validate(answer)
    except ValidationError as exc:
        raise Failed(f"not a {protocol.VERSION} manifest: {first_error(exc)}") from exc
    problems = []
    for spec in manifest.actions:
        why = check_schema(spec.params)
        if why is not None:
            problems.append(f"{spec.name}: params is not a valid JSON Schema: {why}")
    names = {a.name for a in manifest.actions}
    leases = {lease.name for lease in manifest.leases}
    problems += [
        f"--params names {n!r}, which the manifest does not declare" for n in s.options.params if n not in names
    ]
    problems += [
        f"--target names {n!r}, which the manifest does not declare" for n in s.options.targets if n not in leases
    ]
    problems += [
        f"--value names {n!r}, which the manifest does not declare" for n in s.options.values if n not in leases
    ]
    if problems:
        raise Failed("; ".join(problems))
    s.manifest = manifest
    _choose_action(s, manifest)
    ledger = [a.name for a in manifest.actions if a.reversible == "ledger"]
    parts = [f"module {manifest.module}: {len(manifest.actions)} action(s), {len(manifest.leases)} lease(s)"]
    if s.action is not None:
        parts.append(f"testing with {s.action.name} {json.dumps(s.params)}")
    elif not ledger:
        parts.append("no ledger action: the ledger rules are skipped")
    else:
        raise Failed(s.no_action)
    if not manifest.inspect:
        parts.append("no inspect: what reverts did cannot be verified")
    if not manifest.tagged:
        parts.append("no tagged: the orphan sweep cannot reach it")
    return "; ".join(parts)


def _choose_action(s: Session, manifest: protocol.Manifest) -> None:
    """The first ledger action with valid parameters, preferring those given --params."""
    ledger = [a for a in manifest.actions if a.reversible == "ledger"]
    ledger.sort(key=lambda a: a.name not in s.options.params)
    reasons = []
    for spec in ledger:
        given = s.options.params.get(spec.name)
        params = dict(given) if given is not None else example_params(spec.params)
        why = invalid(spec.params, params)
        if why is None:
            s.action, s.params = spec, params
            return
        reasons.append(f"{spec.name} {json.dumps(params)}: {why}")
    if ledger:
        s.no_action = "no ledger action has valid params to test with (" + "; ".join(reasons) + "): pass --params"
    else:
        s.no_action = "the manifest declares no ledger action"
