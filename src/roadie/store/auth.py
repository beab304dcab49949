"""API tokens and dashboard sessions."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import (
    delete,
    or_,
    select,
    update,
)

from roadie.errors import InvalidState, NotFound
from roadie.store.audit import record_audit
from roadie.store.connector import Connector
from roadie.store.rows import SessionRow, TokenRow, from_row, from_rows
from roadie.store.tables import (
    api_tokens,
    web_sessions,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


class AuthQueries(Connector):
    async def create_token(
        self, *, key: str, name: str, role: str, secret_hash: str, actor: str, now: datetime
    ) -> TokenRow:
        """Store a new API token (its secret's hash only). Names are unique among all tokens."""

        async def work(conn: AsyncConnection) -> TokenRow:
            taken = (await conn.execute(select(api_tokens.c.id).where(api_tokens.c.name == name))).first()
            if taken is not None:
                raise InvalidState(f"a token named {name!r} exists already")
            row = (
                await conn.execute(
                    api_tokens.insert()
                    .values(key=key, name=name, role=role, secret_hash=secret_hash, created_at=now, created_by=actor)
                    .returning(*api_tokens.c)
                )
            ).one()
            await record_audit(conn, now, actor, "token.create", f"token:{name}", {"role": role, "key": key})
            return from_row(TokenRow, row)

        result: TokenRow = await self._write("create_token", work)
        return result

    async def list_tokens(self, *, limit: int | None = None, offset: int = 0) -> list[TokenRow]:
        query = select(api_tokens).order_by(api_tokens.c.id).limit(limit).offset(offset)

        async def work(conn: AsyncConnection) -> list[TokenRow]:
            return from_rows(TokenRow, await conn.execute(query))

        result: list[TokenRow] = await self._read(work)
        return result

    async def find_token(self, key: str) -> TokenRow | None:
        """The token whose public key is `key`, revoked or not; None when there is none."""

        async def work(conn: AsyncConnection) -> TokenRow | None:
            row = (await conn.execute(select(api_tokens).where(api_tokens.c.key == key))).first()
            return from_row(TokenRow, row) if row is not None else None

        result: TokenRow | None = await self._read(work, one_statement=True)
        return result

    async def revoke_token(self, token: str, actor: str, now: datetime) -> TokenRow:
        """Revoke a token named by its name, key or id, and end its sessions. Audited."""
        condition = or_(api_tokens.c.name == token, api_tokens.c.key == token)
        if token.isdigit():
            condition = or_(condition, api_tokens.c.id == int(token))

        async def work(conn: AsyncConnection) -> TokenRow:
            row = (await conn.execute(select(api_tokens).where(condition).order_by(api_tokens.c.id))).first()
            if row is None:
                raise NotFound(f"no token {token!r}")
            if row.revoked_at is not None:
                raise InvalidState(f"token {row.name!r} is revoked already")
            await conn.execute(update(api_tokens).where(api_tokens.c.id == row.id).values(revoked_at=now))
            await conn.execute(delete(web_sessions).where(web_sessions.c.token_id == row.id))
            await record_audit(conn, now, actor, "token.revoke", f"token:{row.name}", {"key": row.key})
            revoked = (await conn.execute(select(api_tokens).where(api_tokens.c.id == row.id))).one()
            return from_row(TokenRow, revoked)

        result: TokenRow = await self._write("revoke_token", work)
        return result

    async def create_session(
        self, *, id_hash: str, token: TokenRow, csrf: str, now: datetime, expires_at: datetime
    ) -> None:
        """Open a dashboard session for `token` (and drop sessions that have expired). Audited."""

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(delete(web_sessions).where(web_sessions.c.expires_at < now))
            await conn.execute(
                web_sessions.insert().values(
                    id_hash=id_hash, token_id=token.id, csrf=csrf, created_at=now, expires_at=expires_at
                )
            )
            await record_audit(conn, now, token.name, "session.open", f"token:{token.name}", None)

        await self._write("create_session", work)

    async def get_session(self, id_hash: str, now: datetime) -> SessionRow | None:
        """The unexpired session with this id hash whose token is not revoked, else None."""
        query = (
            select(web_sessions, *[c.label(f"t_{c.name}") for c in api_tokens.c])
            .join(api_tokens, api_tokens.c.id == web_sessions.c.token_id)
            .where(
                web_sessions.c.id_hash == id_hash,
                web_sessions.c.expires_at > now,
                api_tokens.c.revoked_at.is_(None),
            )
        )

        async def work(conn: AsyncConnection) -> SessionRow | None:
            row = (await conn.execute(query)).first()
            if row is None:
                return None
            m = row._mapping
            token = TokenRow(**{c.name: m[f"t_{c.name}"] for c in api_tokens.c})
            return SessionRow(m["id"], m["token_id"], m["csrf"], m["created_at"], m["expires_at"], token)

        result: SessionRow | None = await self._read(work, one_statement=True)
        return result

    async def end_session(self, id_hash: str, actor: str, now: datetime) -> None:
        """Sign out: the session is deleted. Audited."""

        async def work(conn: AsyncConnection) -> None:
            changed = await conn.execute(delete(web_sessions).where(web_sessions.c.id_hash == id_hash))
            if changed.rowcount:
                await record_audit(conn, now, actor, "session.close", f"token:{actor}", None)

        await self._write("end_session", work)
