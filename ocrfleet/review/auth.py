"""Login, CSRF and login throttling for the review app. The session is Starlette's signed
cookie (itsdangerous, HttpOnly, SameSite=Lax); it holds the user id, the account's session
generation when it was issued (see users.py) and a CSRF token.

Throttling counts every attempt in the database before its password is hashed, in one
atomic upsert per key, so parallel guesses and several app processes share one count; a
successful login takes its attempt back. Three keys, each with its own limit per window:
  - name and address together (`review_login_attempts`): guessing one account from one place;
  - the name alone (`review_login_name_attempts`): one account guessed from many places;
  - the address alone (`review_login_address_attempts`): many accounts from one place.
Behind a proxy that hides client addresses every user shares one address, so its limit is
high: a few users' mistakes never lock out the rest; each of them is stopped by its pair.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import case
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from starlette.requests import Request

from ocrfleet.db.models import LoginAttempt

CSRF_FIELD = "csrf"
_INSERTS = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


def csrf_token(request: Request) -> str:
    """The session's token, made on first use (also for the anonymous login form)."""
    token = request.session.get(CSRF_FIELD)
    if not token:
        token = request.session[CSRF_FIELD] = secrets.token_urlsafe(32)
    return str(token)


def csrf_ok(request: Request, submitted: object) -> bool:
    expected = request.session.get(CSRF_FIELD)
    return (
        isinstance(expected, str)
        and isinstance(submitted, str)
        and hmac.compare_digest(expected.encode(), submitted.encode())
    )


def _key(kind: str, *parts: str) -> str:
    """A fixed-length key: names and addresses are whatever the client sent."""
    return hashlib.sha256("\0".join((kind, *parts)).encode("utf-8", "replace")).hexdigest()


@dataclass(frozen=True)
class LoginThrottle:
    """Attempt limits per window (seconds) for the pair, the name and the address."""

    pair_attempts: int
    name_attempts: int
    address_attempts: int
    window: float

    def _limits(self, name: str, address: str) -> list[tuple[str, int]]:
        return [
            (_key("pair", name, address), self.pair_attempts),
            (_key("name", name), self.name_attempts),
            (_key("addr", address), self.address_attempts),
        ]

    def attempt(self, session: Session, name: str, address: str) -> bool:
        """Count one attempt; False when a limit is already reached (do not hash). Stops
        at the first key over its limit, so a blocked guess does not use up the wider
        budgets of the name or the address."""
        now = time.time()
        table = LoginAttempt.__table__
        insert = _INSERTS[session.get_bind().dialect.name]
        if secrets.randbelow(100) == 0:  # now and then, forget windows long past
            session.execute(table.delete().where(table.c.window_start <= now - self.window))
        for key, limit in self._limits(name, address):
            stmt = insert(table).values(key=key, window_start=now, count=1)
            expired = table.c.window_start <= now - self.window
            stmt = stmt.on_conflict_do_update(
                index_elements=[table.c.key],
                set_={
                    "count": case((expired, 1), else_=table.c.count + 1),
                    "window_start": case((expired, now), else_=table.c.window_start),
                },
            ).returning(table.c.count)
            if session.execute(stmt).scalar_one() > limit:
                return False
        return True

    def succeeded(self, session: Session, name: str, address: str) -> None:
        """A right password: its attempt does not count against anyone."""
        table = LoginAttempt.__table__
        keys = [key for key, _ in self._limits(name, address)]
        session.execute(
            table.update()
            .where(table.c.key.in_(keys), table.c.count > 0)
            .values(count=table.c.count - 1)
        )
