"""The floor for `benchmarks/web_latency.py`: a bare FastAPI app on the same stack as
`roadie serve` (uvicorn, SQLAlchemy's async engine over aiosqlite made as Roadie makes
it, `roadie.store.dialects.create_engine`, with its connection settings; the same
database file) that answers `GET /runs/{id}` with the run's row, read with one query, as
JSON. No authentication, no response model, no templates: what any app on this stack
pays to answer a request that reads one row.

    ROADIE_BENCH_DB=/path/roadie.db uvicorn bare_app:app --port P
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI, HTTPException
from sqlalchemy import text

from roadie.store.dialects import create_engine

engine = create_engine(f"sqlite:///{os.environ['ROADIE_BENCH_DB']}")
app = FastAPI()


@app.get("/runs/{run_id}")
async def run(run_id: int) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = (await conn.execute(text("SELECT * FROM runs WHERE id = :id"), {"id": run_id})).mappings().first()
    if row is None:
        raise HTTPException(404)
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}
