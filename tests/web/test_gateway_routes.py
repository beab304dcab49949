"""`roadie serve` answers what remote modules call, as `roadie gateway` does."""

from __future__ import annotations

from roadie import protocol
from tests.web.conftest import Site


def test_the_site_serves_the_gateway_and_refuses_an_unsigned_poll(site: Site) -> None:
    response = site.client.post(protocol.PULL, json={"max": 1, "wait": 0}, headers={protocol.H_MODULE: "lua"})
    assert response.status_code == 401
    assert "no remote module 'lua'" in response.json()["error"]["message"]
    assert all(not path.startswith("/roadie/") for path in site.client.get("/openapi.json").json()["paths"])
