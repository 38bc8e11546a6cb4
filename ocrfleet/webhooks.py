"""Completion webhooks: when a document reaches a terminal state, one POST to its
`callback_url`, signed, retried with backoff, every attempt a row in `deliveries`.

Exactly one delivery is ever enqueued per document: `claim` moves `callback_state` from
NULL to `queued` in one conditional UPDATE, and only the process whose UPDATE matched
enqueues. The delivery task stops at the first 2xx (`delivered`) or after
`webhook_max_attempts` (`gave_up`); a redelivered task message finds the state moved on
and sends nothing. (A worker killed between a receiver's 2xx and the commit that records
it sends once more on redelivery: receivers dedupe on the body's `delivery` id.)

The signature header is `X-Ocrfleet-Signature: t=<unix seconds>,v1=<hex>`, the hex being
HMAC-SHA256 over `<t>.<body>` with `OCRFLEET_WEBHOOK_SECRET`: a receiver recomputes it
and refuses an old `t`, so a captured request cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.db import models
from ocrfleet.tasks.routing import WEBHOOK_TASK, ingest_queue

SIGNATURE_HEADER = "X-Ocrfleet-Signature"
TERMINAL = (
    ir.DocumentStatus.done,
    ir.DocumentStatus.partial,
    ir.DocumentStatus.failed,
    ir.DocumentStatus.rejected,
    ir.DocumentStatus.cancelled,
)
RESULT_FORMATS = ("text", "json", "markdown", "hocr", "alto", "pdf")


class UnsafeCallbackURL(ValueError):
    """A callback URL that is malformed, not http(s), or points into private address space."""


def check_url(url: str, *, allow_private: bool) -> None:
    """Refuse URLs webhooks must not reach: other schemes, and (unless allowed) hosts that
    resolve to loopback, private, link-local, reserved or multicast addresses. Checked at
    submit and again before every attempt, so a DNS change cannot point it inside later."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsafeCallbackURL(f"callback_url must be an http(s) URL with a host: {url!r}")
    if allow_private:
        return
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
    except (OSError, ValueError) as exc:
        raise UnsafeCallbackURL(f"callback_url host {parts.hostname!r} does not resolve") from exc
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global or address.is_multicast:
            raise UnsafeCallbackURL(
                f"callback_url {url!r} resolves to {address}, a non-public address "
                "(set OCRFLEET_WEBHOOK_ALLOW_PRIVATE=true to allow it)"
            )


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The `X-Ocrfleet-Signature` value for `body` sent at `timestamp`."""
    ts = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={digest}"


def verify(
    secret: str, header: str, body: bytes, *, tolerance_s: int = 300, now: float | None = None
) -> bool:
    """What a receiver does: the signature matches and its timestamp is recent."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        ts = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - ts) > tolerance_s:
        return False
    expected = sign(secret, body, ts).split(",", 1)[1].removeprefix("v1=")
    return hmac.compare_digest(expected, fields.get("v1", ""))


def claim(session: Session, document_id: int) -> bool:
    """Whether this caller won the right to enqueue the document's one webhook: it has a
    callback URL, is in a terminal state, and nobody claimed it before."""
    doc = models.Document
    won = session.scalar(
        update(doc)
        .where(
            doc.id == document_id,
            doc.callback_url.is_not(None),
            doc.callback_state.is_(None),
            doc.status.in_([s.value for s in TERMINAL]),
        )
        .values(callback_state="queued")
        .returning(doc.id)
    )
    return won is not None


def notify_finished(settings: Settings, document_id: int) -> bool:
    """Enqueue the document's webhook if it just became due; returns whether it did."""
    from ocrfleet.db.session import session_scope

    if not settings.broker_url:
        return False
    with session_scope(settings.database_url) as session:
        won = claim(session, document_id)
    if won:  # after the commit that claimed it
        from ocrfleet.tasks.app import create_app

        create_app(settings).send_task(WEBHOOK_TASK, args=[document_id], queue=ingest_queue("high"))
    return won


def notify_page_finished(settings: Settings, page_id: int) -> bool:
    """`notify_finished` for the document of a page that was just processed."""
    from ocrfleet.db.session import session_scope

    with session_scope(settings.database_url) as session:
        document_id = session.scalar(
            select(models.Page.document_id).where(models.Page.id == page_id)
        )
    return document_id is not None and notify_finished(settings, document_id)


def result_urls(settings: Settings, document_id: int) -> dict[str, str]:
    base = (settings.api_public_url or "").rstrip("/")
    return {
        fmt: f"{base}/v1/documents/{document_id}/result?format={fmt}" for fmt in RESULT_FORMATS
    }


def payload(settings: Settings, doc: models.Document, attempt: int) -> dict[str, Any]:
    return {
        "delivery": f"{doc.id}-{doc.status}",
        "attempt": attempt,
        "id": doc.id,
        "status": doc.status,
        "reason": doc.reason,
        "pages": {
            "total": doc.page_count,
            "done": doc.pages_done,
            "failed": doc.pages_failed,
        },
        "metadata": doc.meta,
        "results": result_urls(settings, doc.id) if doc.status in ("done", "partial") else {},
    }


@dataclass(frozen=True)
class Attempt:
    """What one delivery attempt did: `final` when no further attempt is due."""

    attempt: int
    delivered: bool
    final: bool
    status_code: int | None = None
    error: str | None = None


def deliver(settings: Settings, document_id: int) -> Attempt:
    """Make the next attempt for a claimed document and record it; a document whose
    webhook was delivered or given up (or never claimed) gets no request."""
    import httpx

    from ocrfleet.db.session import session_scope

    with session_scope(settings.database_url) as session:
        doc = session.get(models.Document, document_id)
        if doc is None or doc.callback_state != "queued" or doc.callback_url is None:
            return Attempt(attempt=0, delivered=False, final=True, error="not due")
        attempt = 1 + (
            session.scalar(
                select(func.count(models.Delivery.id)).where(
                    models.Delivery.document_id == document_id
                )
            )
            or 0
        )
        url, event = doc.callback_url, doc.status
        body = json.dumps(payload(settings, doc, attempt), sort_keys=True).encode()

    status_code: int | None = None
    error: str | None = None
    try:
        if not settings.webhook_secret:
            raise UnsafeCallbackURL("OCRFLEET_WEBHOOK_SECRET is not set: nothing to sign with")
        check_url(url, allow_private=settings.webhook_allow_private)
        response = httpx.post(
            url,
            content=body,
            headers={
                "Content-Type": "application/json",
                "User-Agent": "ocrfleet-webhook",
                SIGNATURE_HEADER: sign(settings.webhook_secret, body),
            },
            timeout=settings.webhook_timeout_s,
            follow_redirects=False,  # a redirect could lead inside; receivers answer 2xx
        )
        status_code = response.status_code
    except UnsafeCallbackURL as exc:
        error = f"refused: {exc}"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:1000]

    delivered = status_code is not None and 200 <= status_code < 300
    final = delivered or attempt >= settings.webhook_max_attempts or (
        error is not None and error.startswith("refused")
    )
    with session_scope(settings.database_url) as session:
        session.add(
            models.Delivery(
                document_id=document_id,
                attempt=attempt,
                url=url,
                event=event,
                status_code=status_code,
                error=error,
            )
        )
        if final:
            session.execute(
                update(models.Document)
                .where(models.Document.id == document_id)
                .values(callback_state="delivered" if delivered else "gave_up")
            )
    return Attempt(attempt, delivered, final, status_code, error)


def backoff_s(settings: Settings, attempt: int) -> float:
    """Delay before attempt `attempt + 1`: the base doubling, capped."""
    return min(settings.webhook_backoff_s * 2 ** (attempt - 1), settings.webhook_backoff_max_s)
