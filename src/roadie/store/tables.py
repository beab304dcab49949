"""The schema, as SQLAlchemy Core tables. Migrations in `migrations/` create exactly this.

Times are stored as UTC and read back timezone-aware. The ledger's live-target key
(DESIGN §4 rule 2) is a partial unique index on `(owner, kind, ref)` over the rows that
still hold their target: the database, not the engine, refuses a second live row.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Sequence,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.types import TypeDecorator

# MySQL's types are loaded only for MariaDB: loading SQLAlchemy's MySQL dialect is 0.03 s
# of CPU that every command on SQLite or PostgreSQL would pay at start.


def __getattr__(name: str) -> Any:
    if name == "PRECISE_DATETIME":  # for the migrations that made the DATETIME(6) columns
        # MariaDB's DATETIME keeps whole seconds unless told otherwise; backoff, claims and
        # the order of events need microseconds.
        from sqlalchemy.dialects import mysql

        return DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class LongText(TypeDecorator[str]):
    """Text, as LONGTEXT on MariaDB (whose TEXT stops at 64 KiB)."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name in ("mysql", "mariadb"):
            from sqlalchemy.dialects import mysql

            return dialect.type_descriptor(mysql.LONGTEXT())
        return dialect.type_descriptor(Text())


_TEXT = "%04d-%02d-%02d %02d:%02d:%02d.%06d"  # a time on SQLite: SQLAlchemy's DATETIME text


class UTCDateTime(TypeDecorator[datetime]):
    """A datetime stored naive in UTC and always read back aware."""

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name in ("mysql", "mariadb"):
            from sqlalchemy.dialects import mysql

            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime())

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are refused: pass an aware UTC time")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    # On SQLite a time is text, in SQLAlchemy's format for DATETIME ("2026-12-05
    # 03:21:52.123456", always six digits, so that text order is time order). The two
    # processors below write and read that text directly: the general path (parse, then
    # `replace(tzinfo=...)`) costs ten times as much, and a page or a drain reads and
    # writes times by the hundred.

    def bind_processor(self, dialect: Dialect) -> Any:
        if dialect.name != "sqlite":
            return super().bind_processor(dialect)

        def process(value: datetime | None) -> str | None:
            if value is None:
                return None
            if value.tzinfo is None:
                raise ValueError("naive datetimes are refused: pass an aware UTC time")
            if value.tzinfo is not UTC:
                value = value.astimezone(UTC)
            # isoformat's text without its "+00:00", made here: isoformat goes through C's
            # printf a field at a time and costs about 2,000 instructions more, ten times a step.
            v = value
            return _TEXT % (v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond)

        return process

    def result_processor(self, dialect: Dialect, coltype: Any) -> Any:
        general = super().result_processor(dialect, coltype)
        if dialect.name != "sqlite" or general is None:
            return general

        def process(value: str | None) -> datetime | None:
            if value is None:
                return None
            try:
                return datetime.fromisoformat(value + "+00:00")
            except (TypeError, ValueError):  # not the text this type writes
                return general(value)

        return process


metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

LIVE_STATES = ("pending", "live")

events = Table(
    "events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_id", String(100), nullable=False),
    Column("version", Integer, nullable=False),
    Column("title", String(200), nullable=False, default=""),
    Column("definition", JSON, nullable=False),
    # An event file may hold 4,000,000 characters; MariaDB's TEXT holds 65,535 bytes.
    Column("source", LongText(), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("created_by", String(100), nullable=False),
    UniqueConstraint("event_id", "version"),
)

runs = Table(
    "runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("nonce", String(32), nullable=False),
    Column("event_id", String(100), nullable=False),
    Column("event_version", Integer, nullable=False),
    Column("title", String(200), nullable=False, default=""),
    Column("definition", JSON, nullable=False),
    Column("params", JSON, nullable=False),
    Column("status", String(16), nullable=False),
    Column("cleanup_policy", String(16), nullable=False),
    Column("cleanup_status", String(16), nullable=False),
    Column("phase", Integer, nullable=False, default=0),
    Column("materialised_phase", Integer, nullable=False, default=-1),
    Column("phase_due_at", UTCDateTime, nullable=True),
    Column("ends_at", UTCDateTime, nullable=True),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("error", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("created_by", String(100), nullable=False),
    Column("started_at", UTCDateTime, nullable=True),
    Column("ended_at", UTCDateTime, nullable=True),
    Column("cleanup_claimed_by", String(100), nullable=True),
    Column("cleanup_claim_expires", UTCDateTime, nullable=True),
    # The token of the cleanup that holds the run (DESIGN §11): minted per claim, and named
    # by every write that cleanup makes. `cleanup_claimed_by` only says who, for people.
    Column("cleanup_token", String(64), nullable=True),
    Column("cleanup_attempts", Integer, nullable=False, default=0),
    Column("cleanup_started_at", UTCDateTime, nullable=True),
    Column("cleanup_ended_at", UTCDateTime, nullable=True),
    Column("cleanup_report", JSON, nullable=True),
    # One occurrence of a schedule makes one run, however many workers saw it due: the
    # database refuses a second run with the same key (DESIGN §2).
    Column("schedule_key", String(190), nullable=True),
    Index(None, "status"),
    UniqueConstraint("schedule_key"),
)

steps = Table(
    "steps",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id"), nullable=False),
    Column("phase", Integer, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("name", String(200), nullable=False),
    Column("action", String(130), nullable=False),
    Column("owner", String(64), nullable=False),
    Column("reversible", String(16), nullable=False),
    Column("lease_ref", String(190), nullable=True),
    Column("params", JSON, nullable=False),
    Column("idempotency_key", String(100), nullable=False, unique=True),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("max_attempts", Integer, nullable=False),
    Column("retry", JSON, nullable=False),
    Column("timeout", Float, nullable=False),
    Column("on_error", String(16), nullable=False),
    Column("not_before", UTCDateTime, nullable=False),
    Column("claimed_by", String(100), nullable=True),
    Column("claim_expires", UTCDateTime, nullable=True),
    # The token of the attempt in flight, minted when it is claimed: only its holder may
    # record the step's answer or its resources.
    Column("claim_token", String(64), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime, nullable=True),
    Column("ended_at", UTCDateTime, nullable=True),
    Column("error", Text, nullable=True),
    Column("output", JSON, nullable=True),
    Column("rejections", JSON, nullable=True),
    Column("attempt_log", JSON, nullable=True),
    UniqueConstraint("run_id", "phase", "seq"),
    Index(None, "status", "not_before", "id"),  # a claim's order: see migration 0015
)

run_resources = Table(
    "run_resources",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id"), nullable=False),
    Column("step_id", Integer, ForeignKey("steps.id"), nullable=True),
    Column("owner", String(64), nullable=False),
    Column("kind", String(64), nullable=False),
    Column("ref", String(190), nullable=False),
    Column("payload", JSON, nullable=True),
    Column("until", UTCDateTime, nullable=True),
    Column("member_key", String(190), nullable=True),
    Column("state", String(16), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("reverted_at", UTCDateTime, nullable=True),
    Column("attempts", Integer, nullable=False, default=0),
    Column("error", Text, nullable=True),
    # A lease row being given back is held by one restorer (the expiry sweeper or its run's
    # cleanup) until it is marked reverted or the claim expires.
    Column("claim_token", String(64), nullable=True),
    Column("claim_expires", UTCDateTime, nullable=True),
    Index(None, "run_id", "state"),
    Index(None, "run_id", "id"),  # a run's rows newest first, a page at a time (cleanup)
    Index(None, "state", "kind", "until"),
    Index(None, "step_id", "state"),
    Index(
        "uq_run_resources_live_target",
        "owner",
        "kind",
        "ref",
        unique=True,
        sqlite_where=text("state IN ('pending', 'live')"),
    ),
    # Migration 0001 builds this key on every database: the same partial index on
    # PostgreSQL (not named here: a `postgresql_where` has SQLAlchemy load its PostgreSQL
    # dialect in every process, 0.04 s of a command's start on SQLite), and on MariaDB,
    # which has no partial indexes, a unique generated column that is NULL for rows that
    # no longer hold their target.
)

audit = Table(
    "audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime, nullable=False),
    Column("actor", String(100), nullable=False),
    Column("action", String(64), nullable=False),
    Column("subject", String(200), nullable=False),
    Column("detail", JSON, nullable=True),
    Index(None, "subject"),
)

# Where each scheduled event's schedule stands: the newest occurrence already turned
# into a run or skipped. A row is made when a worker first sees the schedule, starting
# from the moment its event version was applied, so no backlog reaches back further.
schedules = Table(
    "schedules",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_id", String(100), nullable=False),
    Column("last_occurrence", UTCDateTime, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    UniqueConstraint("event_id"),
)

# Every worker process says here that it is alive (`heartbeat_at`) and when it stopped.
# Claims are judged by their own expiry, not by this table: it is what an operator reads
# (`roadie workers`), and where one heartbeat write per interval is anchored.
workers = Table(
    "workers",
    metadata,
    Column("worker_id", String(100), primary_key=True),
    Column("host", String(200), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("heartbeat_at", UTCDateTime, nullable=False),
    Column("stopped_at", UTCDateTime, nullable=True),
    Column("concurrency", Integer, nullable=False),
    Column("version", String(32), nullable=False),
    Index(None, "heartbeat_at"),
)

# A lease that stacks (DESIGN §12), one row per target: the value from before its first
# layer (`base`), what Roadie last wrote to it (`shown`) and is about to write (`writing`),
# each as {"value": ...} or NULL for none. Its layers are the `@layer` rows of
# run_resources. One owner at a time changes what the world shows: the claim.
lease_stacks = Table(
    "lease_stacks",
    metadata,
    Column("ref", String(190), primary_key=True),
    Column("base", JSON, nullable=True),
    Column("shown", JSON, nullable=True),
    Column("writing", JSON, nullable=True),
    Column("claim_token", String(64), nullable=True),
    Column("claim_expires", UTCDateTime, nullable=True),
    Column("updated_at", UTCDateTime, nullable=False),
)

# The pull transport's work queue (docs/protocol.md): a call for a module that polls the
# engine instead of being called. A call is handed out (`deliveries` + 1) and stays
# invisible until `visible_at`; unanswered by then, it is handed out again under the same
# key. The same call made again (a step retried) is the same row: `call_hash`.
remote_calls = Table(
    "remote_calls",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("module", String(64), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("idempotency_key", String(190), nullable=False),
    Column("call_hash", String(64), nullable=False),
    Column("body", JSON, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("visible_at", UTCDateTime, nullable=False),
    Column("deliveries", Integer, nullable=False, default=0),
    Column("answered_at", UTCDateTime, nullable=True),
    Column("answer_status", Integer, nullable=True),
    Column("answer", JSON, nullable=True),
    # The token of the delivery in hand, minted by each take: only an answer naming it is
    # kept, so the answer of a delivery that was handed out again is not (DESIGN §11).
    Column("delivery_token", String(64), nullable=True),
    # Set when the caller gave up on the call (its deadline passed, its step or cleanup
    # ended): a withdrawn call is never handed out again and its answer is not kept.
    Column("withdrawn_at", UTCDateTime, nullable=True),
    Column("withdrawn_reason", String(255), nullable=True),
    UniqueConstraint("module", "call_hash"),
    Index(None, "module", "answered_at", "visible_at"),
)

# What each pulling module last announced about itself: its manifest.
remote_modules = Table(
    "remote_modules",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("manifest", JSON, nullable=False),
    Column("announced_at", UTCDateTime, nullable=False),
    Column("polled_at", UTCDateTime, nullable=True),
)

# The ids of signed requests the gateway accepted from pulling modules, each kept until its
# timestamp leaves the signing window: a request arriving again with a kept id is a replay
# (docs/protocol.md §1). Rows past `expires_at` are deleted as new ones come.
seen_requests = Table(
    "seen_requests",
    metadata,
    Column("module", String(64), primary_key=True),
    Column("request_id", String(64), primary_key=True),
    Column("expires_at", UTCDateTime, nullable=False),
    Index(None, "expires_at"),
)

# API tokens of `roadie serve` (one role each). Only the secret's SHA-256 is kept; `key`
# is the public half of the token, by which a presented token is found.
api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key", String(32), nullable=False),
    Column("name", String(100), nullable=False),
    Column("role", String(16), nullable=False),
    Column("secret_hash", String(64), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("created_by", String(100), nullable=False),
    Column("revoked_at", UTCDateTime, nullable=True),
    UniqueConstraint("key"),
    UniqueConstraint("name"),
)

# Dashboard sessions, kept server-side so that revoking a token (or signing out) ends its
# sessions at once. `id_hash` is the SHA-256 of the id the signed cookie carries.
web_sessions = Table(
    "web_sessions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("id_hash", String(64), nullable=False),
    Column("token_id", Integer, ForeignKey("api_tokens.id"), nullable=False),
    Column("csrf", String(64), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    UniqueConstraint("id_hash"),
    Index(None, "expires_at"),
)

# What operators are told about: a run started or ended, a cleanup that left something
# behind. Written in the transaction that made it true, once (`dedup_key`), whatever retries.
notifications = Table(
    "notifications",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dedup_key", String(190), nullable=False),
    Column("kind", String(40), nullable=False),
    Column("run_id", Integer, nullable=True),
    Column("payload", JSON, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("dedup_key"),
)

# The webhooks some process was configured with. A notification gets a delivery for each
# target known when it is written, so one configured later is not sent the past.
webhook_targets = Table(
    "webhook_targets",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("registered_at", UTCDateTime, nullable=False),
    # The sender that holds a webhook sends its deliveries, one after another, oldest first.
    Column("claim_token", String(64)),
    Column("claim_expires", UTCDateTime),
)

# One notification sent to one webhook, retried until it is taken, refused for good, or
# out of attempts. A sender claims it under a token first, and every write names it.
deliveries = Table(
    "deliveries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("notification_id", Integer, ForeignKey("notifications.id"), nullable=False),
    Column("target", String(64), nullable=False),
    Column("state", String(16), nullable=False),  # pending | delivered | skipped | gave_up
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_at", UTCDateTime, nullable=False),
    Column("claim_token", String(64), nullable=True),
    Column("claim_expires", UTCDateTime, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("updated_at", UTCDateTime, nullable=False),
    UniqueConstraint("notification_id", "target"),
    Index(None, "state", "next_at"),
)

# Fences (docs/protocol.md §4, rule 7): a number minted in the transaction that takes a
# claim to change the world, higher than every one minted before it, sent with each call
# made under the claim so that a module can refuse a call from an owner since replaced.
# PostgreSQL and MariaDB mint from the sequence, outside any lock; SQLite, which has no
# sequences and one writer at a time, counts in the table's one row (id 1).
fence_sequence = Sequence("roadie_fence", metadata=metadata)
fence_counter = Table(
    "fence_counter",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("value", BigInteger, nullable=False),
)
