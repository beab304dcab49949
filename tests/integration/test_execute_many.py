"""`executemany.execute_many`: rows handed to the driver's executemany in one pass are written
exactly as SQLAlchemy's own executemany writes them, on every database."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import bindparam, select, update
from tests.conftest import Harness
from tests.integration.test_ledger_rules import one_step

from roadie.store import statements
from roadie.store.executemany import execute_many
from roadie.store.tables import run_resources

PAYLOADS: list[Any] = [None, {"a": [1, "é"], "b": None}, [1, 2.5], "text", 3]


def test_rows_passed_in_one_pass_are_written_as_sqlalchemy_writes_them(harness: Harness) -> None:
    async def body() -> None:
        store = harness.store
        run = await harness.start(one_step({}, cleanup="manual"))
        now = harness.clock.now()

        def rows(prefix: str, **extra: Any) -> list[dict[str, Any]]:
            return [
                {
                    "run_id": run.id,
                    "step_id": None,
                    "owner": "probe",
                    "kind": "thing",
                    "ref": f"{prefix}-{i}",
                    "payload": payload,
                    "state": "pending",
                    "created_at": now + timedelta(microseconds=i),
                    "updated_at": now,
                    **extra,
                }
                for i, payload in enumerate(PAYLOADS)
            ]

        # The same statement object each time, as the store's are.
        renamed = (
            update(run_resources).where(run_resources.c.ref == bindparam("b_ref")).values(state=bindparam("b_state"))
        )
        async with store.engine.begin() as conn:
            await execute_many(conn, *statements.insert_rows(store.dialect, run_resources, rows("ours", attempts=2)))
            await conn.execute(*statements.insert_rows(store.dialect, run_resources, rows("theirs", attempts=2)))
            # A column left to its Python default: SQLAlchemy computes it per row, so these go its way.
            await execute_many(conn, *statements.insert_rows(store.dialect, run_resources, rows("defaulted")))
            changes = [{"b_ref": f"ours-{i}", "b_state": "live"} for i in range(len(PAYLOADS))]
            changed = await execute_many(conn, renamed, [*changes, {"b_ref": "none such", "b_state": "live"}])
            assert changed.rowcount == len(PAYLOADS)
            await conn.execute(renamed, [{**c, "b_ref": c["b_ref"].replace("ours", "theirs")} for c in changes])

        columns = ("ref", "payload", "state", "created_at", "updated_at", "attempts")
        async with store.engine.connect() as conn:
            # As the database holds them (the driver's own values, no SQLAlchemy type), and as read.
            raw = (await conn.exec_driver_sql(f"SELECT {', '.join(columns)} FROM run_resources ORDER BY ref")).all()
            read = (await conn.execute(select(*(run_resources.c[c] for c in columns)))).all()

        def by_ref(found: list[Any], prefix: str) -> list[tuple[Any, ...]]:
            return sorted((r[0].split("-")[-1], *r[1:]) for r in found if r[0].startswith(prefix + "-"))

        for found in (raw, read):
            ours, theirs = by_ref(found, "ours"), by_ref(found, "theirs")
            assert len(ours) == len(PAYLOADS)
            assert ours == theirs
        assert [r[1] for r in by_ref(read, "ours")] == PAYLOADS
        assert {r[-1] for r in by_ref(read, "defaulted")} == {0}

    harness.run(body)


def test_a_value_the_same_in_every_row_is_written_as_every_row_gave_it(harness: Harness) -> None:
    """On PostgreSQL a column whose value is the same in every row goes once, not as an
    array (`statements.insert_rows`, `many_rows`). Equal is not the same for JSON: `1`,
    `True` and `1.0` are equal in Python, and each must come back as it went in."""

    async def body() -> None:
        store = harness.store
        run = await harness.start(one_step({}, cleanup="manual"))
        now = harness.clock.now()
        later = now + timedelta(seconds=1)
        shared = {"same": "object"}
        sets: dict[str, list[Any]] = {
            "n": [1, True, 1],  # equal in Python, each its own JSON
            "d": [{"a": 1}, {"a": True}, {"a": 1.0}],
            "s": [shared, shared, shared],  # one object in every row
        }

        def rows(prefix: str) -> list[dict[str, Any]]:
            return [
                {
                    "run_id": run.id,
                    "step_id": None,
                    "owner": "probe",  # the same in every row
                    "kind": "thing",
                    "ref": f"{prefix}-{i}",
                    "payload": payload,
                    "member_key": None,
                    "until": None,
                    "state": "live" if i else "pending",  # the same but in the first row
                    "created_at": now,
                    "updated_at": now,
                    "attempts": 0,
                    "error": None,
                }
                for i, payload in enumerate(sets[prefix])
            ]

        c = run_resources.c
        async with store.engine.begin() as conn:
            for prefix in sets:
                await execute_many(conn, *statements.insert_rows(store.dialect, run_resources, rows(prefix)))
            columns = {"b_ref": c.ref, "b_error": c.error, "b_at": c.updated_at}
            changes = [{"b_ref": f"s-{i}", "b_error": "gone" if i % 2 else "kept", "b_at": later} for i in range(3)]
            fixed, params = statements.many_rows_params(store.dialect, columns, changes)
            source = statements.many_rows(store.dialect, columns, fixed)
            statement = (
                update(run_resources)
                .where(c.ref == source["b_ref"])
                .values(error=source["b_error"], updated_at=source["b_at"])
            )
            assert (await execute_many(conn, statement, params)).rowcount == 3

        async with store.engine.connect() as conn:
            read = (await conn.execute(select(c.ref, c.payload, c.state, c.owner, c.error, c.updated_at))).all()
        got = {r.ref: r for r in read}
        assert len(got) == 9
        for prefix, payloads in sets.items():
            for i, payload in enumerate(payloads):
                row = got[f"{prefix}-{i}"]
                assert row.payload == payload
                assert repr(row.payload) == repr(payload)  # True as True, 1.0 as 1.0
                assert row.state == ("live" if i else "pending")
                assert row.owner == "probe"
        for i in range(3):
            assert (got[f"s-{i}"].error, got[f"s-{i}"].updated_at) == ("gone" if i % 2 else "kept", later)
        assert {got[f"n-{i}"].updated_at for i in range(3)} == {now}

    harness.run(body)
