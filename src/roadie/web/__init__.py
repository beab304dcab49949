"""`roadie serve`: the HTTP API (`/api/v1`, OpenAPI at `/openapi.json`), the staff
dashboard, Prometheus metrics, and an embedded worker."""

from __future__ import annotations

from roadie.web.app import create_app
from roadie.web.state import WebOptions

__all__ = ["WebOptions", "create_app"]
