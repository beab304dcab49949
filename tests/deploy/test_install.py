"""Roadie as a user installs it: the wheel built from this checkout, installed into a fresh
virtual environment with no extra and with each extra, then `roadie demo` in an empty
folder. A command whose extra is missing says which to install, in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

from tests.databases import Database
from tests.plugin import test_standalone as standalone

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 600


def _run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROADIE_", "VIRTUAL_ENV", "PYTHON"))}
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT, env=env, check=False
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of what the wheel is made of: an in-tree build would keep files of
    earlier builds (`build/`) that the checkout no longer has."""
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    built = _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", out, source)
    assert built.returncode == 0, built.stderr
    [found] = out.glob("roadie-*.whl")
    return found


@pytest.fixture
def installed(request: pytest.FixtureRequest, wheel: Path, tmp_path: Path) -> Path:
    """A fresh virtual environment holding the wheel with the extra asked for; its bin."""
    extra: str = request.param
    home = tmp_path / "venv"
    venv.create(home, with_pip=True)
    bin_dir = home / "bin"
    target = f"{wheel}[{extra}]" if extra else str(wheel)
    done = _run(bin_dir / "python", "-m", "pip", "install", "--quiet", "-c", ROOT / "constraints.txt", target)
    assert done.returncode == 0, done.stderr
    return bin_dir


def _demo(bin_dir: Path, folder: Path) -> None:
    folder.mkdir()
    shown = _run(bin_dir / "roadie", "demo", cwd=folder)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "after cleanup the world equals the world before the run" in shown.stdout


@pytest.mark.parametrize("installed", [""], indirect=True, ids=["no extra"])
def test_without_extras_the_demo_runs_and_the_rest_says_what_to_install(installed: Path, tmp_path: Path) -> None:
    _demo(installed, tmp_path / "empty")
    for command, says in (
        (["serve"], "roadie serve needs the 'web' extra"),
        (["gateway"], "roadie gateway needs the 'web' extra"),
        (["run", "list", "--database-url", "postgresql://u@127.0.0.1/x"], "pip install 'roadie[postgresql]'"),
        (["run", "list", "--database-url", "mysql://u@127.0.0.1/x"], "pip install 'roadie[mariadb]'"),
    ):
        done = _run(installed / "roadie", *command, cwd=tmp_path)
        assert done.returncode == 69, done.stderr
        [line] = done.stderr.strip().splitlines()
        assert says in line, line
    metadata = _run(
        installed / "python",
        "-c",
        "from importlib.metadata import metadata; print(metadata('roadie')['License-Expression'])",
    )
    assert metadata.stdout.strip() == "MIT"
    licence = _run(
        installed / "python", "-c", "from importlib.metadata import files; print([str(f) for f in files('roadie')])"
    )
    assert "LICENSE" in licence.stdout
    absent = _run(installed / "python", "-c", "import fastapi")
    assert absent.returncode != 0  # the web stack is the web extra's, not everyone's


@pytest.mark.parametrize("installed", ["postgresql", "mariadb"], indirect=True)
def test_with_a_database_extra_its_server_is_usable(
    installed: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    extra = request.node.callspec.params["installed"]
    database = Database(extra)
    url = database.fresh(tmp_path)
    try:
        _demo(installed, tmp_path / "empty")
        done = _run(installed / "roadie", "run", "list", "--json", "--database-url", url, cwd=tmp_path)
        assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
    finally:
        database.drop_all()


@pytest.mark.parametrize("installed", ["web"], indirect=True)
def test_with_the_web_extra_the_web_commands_start(installed: Path, tmp_path: Path) -> None:
    _demo(installed, tmp_path / "empty")
    for command in (["serve", "--help"], ["gateway", "--help"]):
        done = _run(installed / "roadie", *command, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    imported = _run(installed / "python", "-c", "import roadie.web, roadie.remote.gateway, roadie.plugin")
    assert imported.returncode == 0, imported.stderr


def test_the_plugin_sdk_alone_installs_without_the_engines_libraries(tmp_path: Path) -> None:
    """`roadie-plugin` (sdk/build.py, `make sdk`), installed into a fresh virtual
    environment, brings pydantic, httpx, Starlette, structlog and uvicorn and none of the
    engine's libraries, and serves a module: a signed manifest and dispatch answered."""
    sdk = tomllib.loads((ROOT / "sdk" / "pyproject.toml").read_text())["project"]
    full = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert (sdk["version"], sdk["dependencies"]) == (full["version"], full["optional-dependencies"]["plugin"])
    built = _run(sys.executable, ROOT / "sdk" / "build.py", "--out", tmp_path / "dist")
    assert built.returncode == 0, built.stderr
    wheel = Path(built.stdout.strip().splitlines()[-1])
    home = tmp_path / "venv"
    venv.create(home, with_pip=True)
    python = home / "bin" / "python"
    done = _run(python, "-m", "pip", "install", "--quiet", "-c", ROOT / "constraints.txt", wheel)
    assert done.returncode == 0, done.stderr
    installed = _run(python, "-m", "pip", "list", "--format=freeze").stdout.lower()
    names = {line.split("==")[0].replace("_", "-") for line in installed.splitlines()}
    assert "roadie-plugin" in names
    engine_only = {"sqlalchemy", "alembic", "aiosqlite", "psycopg", "asyncmy", "fastapi", "jinja2", "typer", "rich"}
    assert names & engine_only == set(), sorted(names)
    served = _run(python, "-c", standalone.SCRIPT, ",".join(standalone.REFUSED), cwd=tmp_path)
    assert served.returncode == 0, served.stderr
    assert served.stdout.splitlines()[-1:] == ["served"], served.stdout
    assert not (home / "bin" / "roadie").exists()  # the command line is the full distribution's
