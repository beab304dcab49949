"""Property-based tests of the API from its own OpenAPI document (schemathesis's pytest
integration, against the ASGI app): whatever a client sends, the server never answers
5xx. SQLite only, with a CI-sized budget of examples per operation.

The app is built when the module is imported, because the schema it serves decides which
tests exist; its database lives in a temporary directory removed at exit.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from roadie.web import WebOptions, create_app
from tests.web.conftest import mint_tokens

MAX_EXAMPLES = 8

_home = Path(tempfile.mkdtemp(prefix="roadie-schemathesis-"))
atexit.register(shutil.rmtree, _home, True)
(_home / "roadie.toml").write_text(f'[modules.sandbox]\ndb = "{_home / "world.db"}"\n')
_url = f"sqlite:///{_home / 'roadie.db'}"
# Spare tokens first, so a generated DELETE /tokens/1 revokes a spare, not the admin.
mint_tokens(_url, *[f"spare{i}" for i in range(9)], role="viewer")
ADMIN = mint_tokens(_url, "admin")["admin"]
app = create_app(WebOptions(database_url=_url, config=str(_home / "roadie.toml"), worker=False))
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: Any) -> None:
    """Any request the schema allows, and many it does not, gets a 2xx or a 4xx."""
    if case.path == "/api/v1/runs/{run_id}/events":
        case.path_parameters = {"run_id": 10**9}  # an unknown run: 404 at once, never a stream left open
    response = case.call(headers={"Authorization": f"Bearer {ADMIN}"})
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_answer_is_one_the_document_declares(case: Any) -> None:
    """The OpenAPI document is true to the server: every status a route answers, errors
    included, is declared for it, with the body the server really sends."""
    if case.path == "/api/v1/runs/{run_id}/events":
        case.path_parameters = {"run_id": 10**9}
    response = case.call(headers={"Authorization": f"Bearer {ADMIN}"})
    case.validate_response(response, checks=[status_code_conformance, response_schema_conformance])
