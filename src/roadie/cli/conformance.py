"""`roadie conformance URL --secret S`: check a module server against the protocol."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from roadie.cli.common import ConfigOption, JsonOption, console, exit_code, fail, line, name_values, require_web
from roadie.errors import RoadieError

if TYPE_CHECKING:
    from roadie.conformance import Report

# By outcome (`Outcome`, a string enum: its values are these keys).
_STYLE = {"pass": ("pass", "green"), "fail": ("FAIL", "red"), "skip": ("skip", "yellow")}

# The rules, in the order they run, for --rule's help: named here so that the help is
# printed without loading the checks and their libraries (httpx, jsonschema);
# tests/unit/test_cli_imports.py holds them to `roadie.conformance.RULE_NAMES`.
RULE_NAMES = (
    "manifest",
    "same_key",
    "inspect",
    "tagged",
    "revert_by_key",
    "foreign_tag",
    "revert_missing",
    "signature",
    "malformed",
    "lease_restore",
    "lease_late_apply",
    "lease_layers",
    "stale_fence",
    "cleanup",
)


def _pairs(values: list[str], flag: str, *, as_json: bool) -> dict[str, Any]:
    found: dict[str, Any] = name_values(values, flag)
    if as_json:
        for name, value in found.items():
            try:
                found[name] = json.loads(value)
            except json.JSONDecodeError as exc:
                raise typer.BadParameter(f"{name}: not JSON: {exc}", param_hint=flag) from None
    return found


def conformance(
    url: str | None = typer.Argument(
        None,
        metavar="URL",
        help="The module server's URL (with --pull: where to serve the work queue). Without it, --module "
        "names a module of roadie.toml (a console world) to check in this process against its live world.",
    ),
    secret: str | None = typer.Option(
        None,
        "--secret",
        envvar="ROADIE_CONFORMANCE_SECRET",
        help="The module's shared secret (env ROADIE_CONFORMANCE_SECRET).",
    ),
    as_json: bool = JsonOption,
    target: list[str] = typer.Option(
        [], "--target", metavar="LEASE=TARGET", help="The target to test a targeted lease on."
    ),
    params: list[str] = typer.Option([], "--params", metavar="ACTION=JSON", help="The params to test an action with."),
    value: list[str] = typer.Option(
        [], "--value", metavar="LEASE=JSON", help="The value to borrow while testing a lease."
    ),
    rule: list[str] = typer.Option([], "--rule", metavar="RULE", help=f"Only these rules ({', '.join(RULE_NAMES)})."),
    pull: bool = typer.Option(False, "--pull", help="Serve a work queue at URL and check the module that polls it."),
    module: str | None = typer.Option(
        None,
        "--module",
        metavar="NAME",
        help="With --pull: the module's name. Without a URL: the module of roadie.toml to check.",
    ),
    timeout: float = typer.Option(
        30.0,
        "--timeout",
        metavar="SECONDS",
        min=0.1,
        help="Seconds to wait for each answer; with --pull, also for the module to announce itself.",
    ),
    config: str | None = ConfigOption,
) -> None:
    """Check a module server against the remote protocol, or (no URL, --module NAME) a
    module of roadie.toml against its live world: one row per rule, exit 1 on any failure.

    Everything the checks make is made under keys of their own and reverted by key at the
    end, so a live world is left as it was. In-process, an action that cannot be taken back
    (a broadcast) runs only when --params gives its params.
    """
    import asyncio

    from roadie.conformance import ConformanceOptions, run_conformance
    from roadie.conformance.transport import TransportFailed

    if url is None:
        if module is None or pull:
            raise typer.BadParameter("give a module server's URL, or --module NAME without --pull", param_hint="URL")
        given = _pairs(params, "--params", as_json=True)
        values, targets = _pairs(value, "--value", as_json=True), _pairs(target, "--target", as_json=False)
        try:
            report = asyncio.run(_check_configured(module, given, values, targets, config))
        except RoadieError as exc:
            fail([exc.message], code=exit_code(exc), kind="config", as_json=as_json)
        _print(report, as_json)
    if secret is None:
        raise typer.BadParameter("a module server is checked with its secret", param_hint="--secret")
    if pull:
        require_web("conformance --pull")
    unknown = [r for r in rule if r not in RULE_NAMES]
    if unknown:
        raise typer.BadParameter(f"no such rule: {', '.join(unknown)}", param_hint="--rule")
    options = ConformanceOptions(
        params=_pairs(params, "--params", as_json=True),
        targets=_pairs(target, "--target", as_json=False),
        values=_pairs(value, "--value", as_json=True),
        pull=pull,
        module=module,
        timeout=timeout,
        announce_timeout=timeout,
        rules=rule or None,
    )
    try:
        report = asyncio.run(run_conformance(url, secret, options=options))
    except TransportFailed as exc:  # --pull could not listen: the operator's to fix
        fail([str(exc)], code=2, kind="transport", as_json=as_json)
    _print(report, as_json)


def _print(report: Report, as_json: bool) -> NoReturn:
    if as_json:
        sys.stdout.write(json.dumps(report.as_dict(), indent=2) + "\n")
    else:
        print_report(report, console)
    raise typer.Exit(0 if report.ok else 1)


async def _check_configured(
    name: str, params: dict[str, Any], values: dict[str, Any], targets: dict[str, Any], config: str | None
) -> Report:
    """Load roadie.toml's modules (no database: nothing is stored) and check one."""
    from roadie.config import load_settings
    from roadie.conformance.inprocess import check_module
    from roadie.consoles import attach_console_modules
    from roadie.registry import build_registry

    settings = load_settings(None, config)
    registry = build_registry(settings.modules, base_dir=settings.base_dir)
    try:
        attach_console_modules(registry, settings.modules, base_dir=settings.base_dir)
        return await check_module(registry, name, params=params, values=values, targets=targets)
    finally:
        await registry.close()


def print_report(report: Report, console: Console) -> None:
    table = Table(title=f"conformance of {report.module or '?'} at {report.url} ({report.mode})", title_justify="left")
    table.add_column("rule", style="bold", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for result in report.results:
        table.add_row(line(f"{result.rule}\n", (result.title, "dim")), line(_STYLE[result.outcome]), result.detail)
    console.print(table)
    failed = report.failed
    if failed:
        console.print(line((f"{len(failed)} rule(s) failed:", "red"), " ", ", ".join(r.rule for r in failed)))
    else:
        console.print(line(("conforms", "green")))


def secret() -> None:
    """Print a new secret for a remote module: `whsec_` and 32 random bytes in base64
    (Standard Webhooks' form). Give it to the engine (roadie.toml or ROADIE_SECRET_<NAME>)
    and to the module; while rotating, both hold the new one and the old one, space-separated."""
    from roadie import protocol

    sys.stdout.write(protocol.new_secret() + "\n")
