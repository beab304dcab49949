"""The plugin SDK stands alone: a module server imports `roadie.plugin` and serves a module
without the engine, the store, or their dependencies (SQLAlchemy, Alembic, the database
drivers, the CLI and the dashboard) — a game server's plugin host installs only the
`plugin` extra."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import venv
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]

# What the SDK must never import. A hook at the front of sys.meta_path refuses them, so a
# stray import anywhere under `roadie.plugin` fails the script instead of passing unseen.
REFUSED = (
    "sqlalchemy",
    "alembic",
    "aiosqlite",
    "psycopg",
    "asyncmy",
    "fastapi",
    "jinja2",
    "typer",
    "roadie.store",
    "roadie.engine",
    "roadie.remote",
    "roadie.cli",
    "roadie.web",
)

# Imports the SDK first (it is what is under test), builds a module server's app, and has
# it answer a signed manifest request and a signed dispatch through its ASGI interface.
SCRIPT = """
import asyncio, json, sys, tempfile
from importlib.abc import MetaPathFinder

REFUSED = sys.argv[1].split(",")

class Refuse(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == r or name.startswith(r + ".") for r in REFUSED):
            raise ImportError(f"the plugin SDK imported {name}")
        return None

sys.meta_path.insert(0, Refuse())

from roadie.plugin import serve_module
import httpx
from pydantic import BaseModel
from roadie import protocol
from roadie.registry import Answer, Module

world = Module("lamps")

class Light(BaseModel):
    room: str

@world.action("light", reversible="ledger", params=Light)
def light(call):
    return Answer(resources=[{"kind": "lamp", "ref": call.params.room}])

@light.revert
def unlight(call):
    return None

async def main(home):
    app = serve_module(world, secret="s", ledger_path=home + "/keys.db")
    await app.state.roadie.open()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://m") as http:
            got = await http.get(protocol.MANIFEST, headers=protocol.sign("s", "GET", protocol.MANIFEST, b""))
            assert got.status_code == 200, got.text
            assert [a["name"] for a in got.json()["actions"]] == ["light"], got.text
            body = json.dumps({"action": "light", "run_id": 1, "step_id": 1, "idempotency_key": "k1",
                               "attempt": 1, "params": {"room": "hall"}, "fence": 1}).encode()
            headers = protocol.sign("s", "POST", protocol.DISPATCH, body, key="k1")
            got = await http.post(protocol.DISPATCH, content=body, headers=headers)
            assert got.status_code == 200, got.text
            assert got.json()["resources"][0]["ref"] == "hall", got.text
    finally:
        await app.state.roadie.close()

with tempfile.TemporaryDirectory() as home:
    asyncio.run(main(home))
leaked = sorted(m for m in sys.modules if any(m == r or m.startswith(r + ".") for r in REFUSED))
assert not leaked, leaked
print("served")
"""


def run(python: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [python, "-c", SCRIPT, ",".join(REFUSED)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=ROOT, check=False)


def test_plugin_sdk_serves_a_module_with_the_engine_refused() -> None:
    """With the store, the engine, the remote client, the CLI, the dashboard and their
    libraries refused at import, `roadie.plugin` still imports, builds a module server and
    answers a signed manifest and dispatch."""
    done = run(sys.executable)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1:] == ["served"], done.stdout


def plugin_distributions() -> dict[str, metadata.Distribution]:
    """The installed distributions the `plugin` extra of pyproject.toml pulls in: its
    requirements and theirs, markers evaluated for this interpreter."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["plugin"]
    found: dict[str, metadata.Distribution] = {}
    todo = [Requirement(line) for line in extra]
    while todo:
        req = todo.pop()
        dist = metadata.distribution(req.name)
        name = dist.metadata["Name"].lower().replace("_", "-")
        if name in found:
            continue
        found[name] = dist
        for line in dist.requires or []:
            sub = Requirement(line)
            extras = req.extras or {""}
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                todo.append(sub)
    return found


def test_plugin_sdk_in_an_environment_holding_only_the_plugin_extra(tmp_path: Path) -> None:
    """A fresh virtual environment (no system site-packages) that holds only the `plugin`
    extra's distributions, and Roadie's source as an editable install would add it, runs the
    same script: the extra is all the SDK needs. The distributions are linked from this
    environment rather than downloaded, so the test runs offline in a few seconds."""
    home = tmp_path / "env"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(home)
    python = home / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for dist in plugin_distributions().values():
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"__pycache__"}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
    (site / "roadie.pth").write_text(str(ROOT / "src") + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}

    probe = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('sqlalchemy'), u.find_spec('fastapi'))"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert probe.stdout.split() == ["None", "None"], "the fresh environment sees the engine's libraries"
    done = run(str(python), env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1:] == ["served"], done.stdout
