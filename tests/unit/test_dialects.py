"""What Roadie makes of an operator's database URL before the driver sees it."""

from __future__ import annotations

import asyncio
import os

import pytest
from sqlalchemy.engine import make_url
from tests.databases import SERVERS, check_reachable

from roadie.errors import ConfigError
from roadie.store import dialects


async def _threshold(url: str) -> object:
    engine = dialects.create_engine(url)
    try:
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            return raw.driver_connection.prepare_threshold  # type: ignore[union-attr]
    finally:
        await engine.dispose()


@pytest.mark.parametrize(("query", "threshold"), [("none", None), ("0", 0), ("10", 10), (None, 5)])
def test_prepare_threshold_in_the_url_reaches_psycopg_as_its_own_parameter(
    query: str | None, threshold: object
) -> None:
    """`?prepare_threshold=none` (what a pooler in transaction mode needs) is taken out of
    the URL, which libpq would refuse, and given to psycopg as its keyword; without it,
    psycopg's own default (prepare after 5 runs) stands."""
    problem = check_reachable("postgresql")
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    url = make_url(SERVERS["postgresql"])
    if query is not None:
        url = url.update_query_dict({"prepare_threshold": query})
    assert asyncio.run(_threshold(url.render_as_string(hide_password=False))) == threshold


def test_a_prepare_threshold_that_is_neither_none_nor_a_number_is_named() -> None:
    with pytest.raises(ConfigError, match="prepare_threshold='sometimes' in the database URL"):
        dialects.create_engine("postgresql://roadie@db.internal/roadie?prepare_threshold=sometimes")
