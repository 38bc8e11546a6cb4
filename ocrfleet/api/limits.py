"""Request limits: a body-size cap that answers 413 before anything reaches the store,
and a token bucket per API key that answers 429."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

Scope = dict[str, Any]


class _TooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: a declared Content-Length over `limit` is refused before reading,
    and a body (chunked or lying) is cut off as soon as it passes `limit`; either way the
    answer is 413, whatever the app made of the cut-off body."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        received = 0
        started = over = False

        async def limited_receive() -> dict[str, Any]:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    over = True
                    raise _TooLarge
            return message

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started
            if over:  # the app's answer to a cut-off body (FastAPI's form parser: a 400)
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await self._refuse(send)
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        with contextlib.suppress(_TooLarge):  # the app let it through: answered below
            await self.app(scope, limited_receive, tracking_send)
        if over and not started:
            await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps(
            {"detail": f"request body over the limit of {self.limit} bytes"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class RateLimiter:
    """A token bucket per key: `rate` tokens a second, at most `burst` saved up. Per API
    process: N processes allow N times the rate."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, float(burst)
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, key: str) -> float:
        """0 if the request may go ahead, else the seconds until it may."""
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens >= 1:
                self._buckets[key] = (tokens - 1, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1 - tokens) / self.rate
