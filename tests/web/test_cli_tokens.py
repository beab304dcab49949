"""`roadie token create|list|revoke` and `roadie serve --help`, as an operator types them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from roadie.cli.main import app
from roadie.web import tokens

runner = CliRunner()


def test_token_create_list_revoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The token is printed once; list shows no secret; revoke marks it; a bad role is refused."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROADIE_DATABASE_URL", f"sqlite:///{tmp_path / 'roadie.db'}")
    made = runner.invoke(app, ["token", "create", "--role", "operator", "--name", "alice"])
    assert made.exit_code == 0, made.output
    token = made.stdout.strip().splitlines()[0]
    assert tokens.split(token) is not None
    listed = runner.invoke(app, ["token", "list", "--json"])
    [row] = json.loads(listed.stdout)
    assert (row["name"], row["role"], row["revoked_at"]) == ("alice", "operator", None)
    assert token not in listed.stdout
    assert "secret_hash" not in row
    assert runner.invoke(app, ["token", "create", "--role", "root", "--name", "bob"]).exit_code == 2
    assert runner.invoke(app, ["token", "create", "--role", "viewer", "--name", "alice"]).exit_code == 1
    assert runner.invoke(app, ["token", "revoke", "alice"]).exit_code == 0
    assert json.loads(runner.invoke(app, ["token", "list", "--json"]).stdout)[0]["revoked_at"]
    assert runner.invoke(app, ["token", "revoke", "alice"]).exit_code == 1


def test_serve_help_names_its_options() -> None:
    result = runner.invoke(app, ["serve", "--help"])
    assert result.exit_code == 0
    for option in (
        "--host",
        "--port",
        "--no-worker",
        "--concurrency",
        "--secret-key",
        "--secure-cookies",
        "--max-body",
    ):
        assert option in result.output
