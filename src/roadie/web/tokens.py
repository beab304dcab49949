"""API tokens: roles, minting, and checking a presented token against its stored hash.

A token reads `rd_<key>_<secret>`. The key is public (it names the row, and `roadie token
list` shows it); the secret is 32 random bytes and only its SHA-256 is stored, so a copy
of the database lets no one sign in. A presented token is looked up by its key and its
secret compared with `hmac.compare_digest`, so the time a comparison takes says nothing
about how much of a guess was right.

This module needs no web framework: the CLI mints tokens with it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import StrEnum

PREFIX = "rd"
KEY_BYTES = 6  # 12 hex characters: a name, not a secret
SECRET_BYTES = 32


class Role(StrEnum):
    """What a token may do. Each role may do everything the roles before it may."""

    VIEWER = "viewer"  # read everything
    OPERATOR = "operator"  # start and cancel runs, clean up
    ADMIN = "admin"  # events, tokens, forgetting resources

    @property
    def rank(self) -> int:
        return list(Role).index(self)

    def allows(self, needed: Role) -> bool:
        return self.rank >= needed.rank


@dataclass(frozen=True)
class Minted:
    """A new token: `token` is shown once; only `key` and `secret_hash` are stored."""

    token: str
    key: str
    secret_hash: str


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def mint() -> Minted:
    key = secrets.token_hex(KEY_BYTES)
    secret = secrets.token_urlsafe(SECRET_BYTES)
    return Minted(f"{PREFIX}_{key}_{secret}", key, hash_secret(secret))


def split(token: str) -> tuple[str, str] | None:
    """(key, secret) of a token in the right shape, else None."""
    prefix, sep, rest = token.strip().partition("_")
    key, sep2, secret = rest.partition("_")
    if prefix != PREFIX or not sep or not sep2 or len(key) != KEY_BYTES * 2 or not secret:
        return None
    return key, secret


def matches(secret: str, secret_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), secret_hash)
