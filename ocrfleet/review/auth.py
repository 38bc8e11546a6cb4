"""Login, CSRF and login throttling for the review app. The session is Starlette's signed
cookie (itsdangerous, HttpOnly, SameSite=Lax); it holds the user id and a CSRF token."""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import defaultdict, deque

from starlette.requests import Request

CSRF_FIELD = "csrf"


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


class LoginThrottle:
    """At most `attempts` failed logins per `window` seconds, counted per user name and per
    client address separately, so neither guessing one account from many places nor many
    accounts from one place gets far. In memory: one count per app process."""

    def __init__(self, attempts: int, window: float) -> None:
        self.attempts = attempts
        self.window = window
        self._failures: defaultdict[str, deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()

    def _recent(self, key: str, now: float) -> deque[float]:
        failures = self._failures[key]
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        return failures

    def blocked(self, name: str, address: str) -> bool:
        now = time.monotonic()
        with self._lock:
            return any(
                len(self._recent(key, now)) >= self.attempts
                for key in (f"user:{name}", f"addr:{address}")
            )

    def failed(self, name: str, address: str) -> None:
        now = time.monotonic()
        with self._lock:
            for key in (f"user:{name}", f"addr:{address}"):
                self._recent(key, now).append(now)

    def succeeded(self, name: str) -> None:
        with self._lock:
            self._failures.pop(f"user:{name}", None)
