"""The systemd units in `deploy/`: valid for systemd itself, and true to the command line
they start (every option they pass exists, every variable they read is one Roadie reads)."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from roadie.cli.main import app

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNITS = sorted(DEPLOY.glob("*.service"))
INSTALLED_AT = "/opt/roadie/venv/bin/roadie"


def _analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        message = "systemd-analyze is not installed (Debian's systemd package)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(path)
    return parser


def test_there_is_a_unit_for_each_long_running_command() -> None:
    assert [u.name for u in UNITS] == ["roadie-gateway.service", "roadie-serve.service", "roadie-worker@.service"]


def test_systemd_accepts_every_unit_without_a_warning(tmp_path: Path) -> None:
    """`systemd-analyze verify` on each unit, pointed at this checkout's `roadie` and the
    example environment file: exit 0 and not one line said (an unknown key or a bad
    value is only a warning to systemd, and a failure here)."""
    analyze = _analyze()
    roadie = str(Path(sys.executable).parent / "roadie")  # this environment's entry point
    names = []
    for unit in UNITS:
        text = unit.read_text().replace(INSTALLED_AT, roadie)
        text = text.replace("EnvironmentFile=/etc/roadie/roadie.env", f"EnvironmentFile={DEPLOY / 'roadie.env'}")
        name = unit.name.replace("@.", "@1.")  # an instance of the template
        (tmp_path / name).write_text(text)
        names.append(f"./{name}")
    done = subprocess.run(
        [analyze, "verify", *names], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_a_unit_starts_a_real_command_with_options_that_exist(unit: Path) -> None:
    service = _unit(unit)["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0] == INSTALLED_AT
    command = [a for a in argv[1:] if not a.startswith("-")][:1]
    help_text = CliRunner().invoke(app, [*command, "--help"]).output
    for option in (a for a in argv[1:] if a.startswith("--")):
        assert option in help_text, f"{unit.name}: {option} is not an option of roadie {command[0]}"
    assert service["KillSignal"] == "SIGTERM"  # the graceful stop every command handles
    assert service["EnvironmentFile"] == "/etc/roadie/roadie.env"


def test_the_environment_file_sets_only_what_roadie_reads() -> None:
    names = {
        line.split("=", 1)[0]
        for line in (DEPLOY / "roadie.env").read_text().splitlines()
        if line and not line.startswith("#")
    }
    assert names == {"ROADIE_DATABASE_URL", "ROADIE_CONFIG", "ROADIE_SECRET_KEY"}
    help_text = CliRunner().invoke(app, ["serve", "--help"]).output
    for name in names:
        assert name in help_text


def test_the_alert_rules_name_metrics_roadie_serves(tmp_path: Path) -> None:
    """Every `roadie_*` series an alert rule reads is one `/metrics` serves."""
    import asyncio

    from roadie.store import Store
    from roadie.web.metrics import Metrics

    async def scrape() -> str:
        store = await Store.open(f"sqlite:///{tmp_path / 'roadie.db'}")
        try:
            return (await Metrics().render(store)).decode()
        finally:
            await store.close()

    served = {line.split("{")[0].split(" ")[0] for line in asyncio.run(scrape()).splitlines() if line[:1] != "#"}
    rules = yaml.safe_load((DEPLOY / "roadie-alerts.yml").read_text())
    [group] = rules["groups"]
    exprs = [rule["expr"] for rule in group["rules"]]
    assert len(exprs) == 4
    for expr in exprs:
        for name in re.findall(r"\broadie_\w+", expr):
            assert name in served, f"{name} in {expr!r} is not served"


def test_no_unit_points_at_documentation_the_installation_does_not_put_there() -> None:
    """Before: every unit said `Documentation=file:///opt/roadie/docs/deploy.md`, which no
    step of docs/deploy.md installs (the package carries no docs), so `systemctl status`
    pointed at nothing. A unit names no local file as its documentation."""
    for unit in UNITS:
        named = _unit(unit).get("Unit", "Documentation", fallback="").split()
        assert [d for d in named if d.startswith("file:")] == [], unit.name
