"""The staff dashboard: server-rendered pages (Jinja2) with htmx for live parts.

Pages read through the same store methods as the API, and act through `service`, so a
button does exactly what the matching API call and CLI command do. Forms post with the
session's CSRF token; after a form the browser is redirected (POST, redirect, GET).

One module a concern: `pages` (templates and rendering), `signin`, `runs` (the runs, the
events, starting a run), `run` (one run) and `world`. Their routes are matched in that order.
"""

from __future__ import annotations

from fastapi import APIRouter

from roadie.web.dashboard import run, runs, signin, world
from roadie.web.dashboard.pages import error_page
from roadie.web.dashboard.signin import local_path, login_address

__all__ = ["error_page", "local_path", "login_address", "router"]

router = APIRouter(include_in_schema=False)
for part in (signin, runs, run, world):
    router.include_router(part.router)
