"""Webhooks: when a document reaches a terminal state, one POST to its `callback_url`;
when review changes a region's text, a `reviewed` event. Each is signed, retried with
backoff, every attempt a row in `deliveries`, and sent from the `webhooks` queue, whose
worker does nothing else (a slow receiver never holds up an upload or a page).

Exactly one completion is ever enqueued per document: `claim` moves `callback_state` from
NULL to `queued` in one conditional UPDATE, and only the process whose UPDATE matched
enqueues. A delivery stops at the first 2xx (`delivered`) or after `webhook_max_attempts`
(`gave_up`); a redelivered task message finds it finished and sends nothing. (A worker
killed between a receiver's 2xx and the commit that records it sends once more on
redelivery: receivers dedupe on the body's `delivery` id.)

The signature header is `X-Ocrfleet-Signature: t=<unix seconds>,kid=<key id>,v1=<hex>`,
the hex being HMAC-SHA256 over `<t>.<body>` with the webhook secret of the API key the
document was submitted with (`kid` is that key's id), or with OCRFLEET_WEBHOOK_SECRET for
a document submitted without a key (`kid=fleet`: the operator's own producers). A
receiver picks its secret by `kid`, recomputes the HMAC and refuses an old `t`, so a
captured request cannot be replayed later, and one tenant's secret verifies nothing sent
to another.

Each attempt resolves the URL's host once, checks every address, connects to that same
address and finishes within OCRFLEET_WEBHOOK_TIMEOUT_S in total (`ocrfleet.outbound`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter
from sqlalchemy import event, func, or_, select, update
from sqlalchemy.orm import Session

from ocrfleet import ir, outbound, states
from ocrfleet.config import Settings
from ocrfleet.db import models
from ocrfleet.errors import public_reason
from ocrfleet.outbound import Resolver, UnsafeCallbackURL
from ocrfleet.tasks.routing import WEBHOOK_QUEUE, WEBHOOK_TASK

__all__ = ["UnsafeCallbackURL", "check_url", "sign", "verify"]

SIGNATURE_HEADER = "X-Ocrfleet-Signature"
FLEET_KEY_ID = "fleet"  # the `kid` of callbacks signed with OCRFLEET_WEBHOOK_SECRET
REVIEWED = "reviewed"  # the event of a review that changed a document's text
RESULT_FORMATS = ("text", "json", "markdown", "hocr", "alto", "pdf")

# Counted by the process that delivers (the `webhooks` worker child, whose /metrics merges
# its processes); `event` is the document's terminal status or `reviewed`.
DELIVERIES = Counter(
    "ocrfleet_webhook_deliveries",
    "Webhooks that ended: delivered (a 2xx), gave_up (out of attempts) or refused (never sent)",
    ["event", "outcome"],
)
FAILURES = Counter(
    "ocrfleet_webhook_failures",
    "Attempts without a 2xx: http_4xx, http_5xx, timeout, connection or refused",
    ["event", "outcome"],
)


def check_url(
    url: str, *, allow_private: bool, timeout_s: float = 10.0, resolver: Resolver | None = None
) -> None:
    """Refuse a callback URL webhooks must not reach (at submit; every attempt checks the
    address it connects to again): other schemes, and unless allowed, a host with any
    address in a special-purpose range. The error never says what the host resolved to."""
    outbound.resolve(
        url,
        allow_private=allow_private,
        deadline=time.monotonic() + timeout_s,
        resolver=resolver,
    )


def sign(secret: str, body: bytes, timestamp: int | None = None, *, key_id: str) -> str:
    """The `X-Ocrfleet-Signature` value for `body` sent at `timestamp`, signed with the
    secret of key `key_id`."""
    ts = int(time.time()) if timestamp is None else timestamp
    return f"t={ts},kid={key_id},v1={_digest(secret, ts, body)}"


def _digest(secret: str, ts: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()


def verify(
    secret: str, header: str, body: bytes, *, tolerance_s: int = 300, now: float | None = None
) -> bool:
    """What a receiver does with the secret its `kid` names: the signature matches and its
    timestamp is recent."""
    try:
        fields = dict(part.strip().split("=", 1) for part in header.split(","))
        ts = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - ts) > tolerance_s:
        return False
    return hmac.compare_digest(_digest(secret, ts, body), fields.get("v1", ""))


def key_id_of(header: str) -> str | None:
    """The `kid` of a signature header: which secret a receiver verifies it with."""
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "kid":
            return value
    return None


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
            doc.status.in_([s.value for s in states.TERMINAL]),
        )
        .values(callback_state="queued")
        .returning(doc.id)
    )
    return won is not None


def notify_finished(settings: Settings, document_id: int) -> bool:
    """Enqueue the document's completion webhook if it just became due; returns whether it
    did."""
    from ocrfleet.db.session import session_scope

    if not settings.broker_url:
        return False
    with session_scope(settings.database_url) as session:
        won = claim(session, document_id)
    if won:  # after the commit that claimed it
        _enqueue(settings, document_id, None)
    return won


def notify_page_finished(settings: Settings, page_id: int) -> bool:
    """`notify_finished` for the document of a page that was just processed."""
    from ocrfleet.db.session import session_scope

    with session_scope(settings.database_url) as session:
        document_id = session.scalar(
            select(models.Page.document_id).where(models.Page.id == page_id)
        )
    return document_id is not None and notify_finished(settings, document_id)


def _enqueue(settings: Settings, document_id: int, review_id: int | None) -> None:
    from ocrfleet.tasks.app import create_app

    args: list[int] = [document_id] if review_id is None else [document_id, review_id]
    create_app(settings).send_task(WEBHOOK_TASK, args=args, queue=WEBHOOK_QUEUE)


def notify_reviewed(
    session: Session, review: models.Review, settings: Settings | None = None
) -> bool:
    """Called where a reviewer's decision is recorded, inside its transaction: when the
    decision changes the region's text (from the last decision's, or the engines' chosen
    reading) and the document has a callback, a `reviewed` event is enqueued once the
    transaction commits (nothing is sent for one that rolls back)."""
    from ocrfleet.config import get_settings

    settings = settings or get_settings()
    if review.final_text is None or not settings.broker_url:
        return False  # a skip decides nothing; no fleet to deliver from
    region = session.get(models.Region, review.region_id)
    if region is None:
        return False
    previous = session.scalar(
        select(models.Review.final_text)
        .where(
            models.Review.region_id == review.region_id,
            models.Review.id != review.id,
            models.Review.action != ir.ReviewAction.skip.value,
        )
        .order_by(models.Review.id.desc())
        .limit(1)
    )
    if previous is None:
        previous = session.scalar(
            select(models.Candidate.text).where(
                models.Candidate.region_id == region.id,
                models.Candidate.engine == (region.chosen_engine or ""),
            )
        )
    if previous == review.final_text:
        return False
    document_id, callback_url = session.execute(
        select(models.Document.id, models.Document.callback_url)
        .join(models.Page, models.Page.document_id == models.Document.id)
        .where(models.Page.id == region.page_id)
    ).one()
    if callback_url is None:
        return False
    review_id = review.id

    def send(_session: Session) -> None:
        _enqueue(settings, document_id, review_id)

    event.listen(session, "after_commit", send, once=True)
    return True


def result_urls(settings: Settings, document_id: int) -> dict[str, str]:
    base = (settings.api_public_url or "").rstrip("/")
    return {
        fmt: f"{base}/v1/documents/{document_id}/result?format={fmt}" for fmt in RESULT_FORMATS
    }


def delivery_id(doc: models.Document, review_id: int | None) -> str:
    """What receivers dedupe on: one id per webhook, the same on every attempt."""
    if review_id is None:
        return f"{doc.id}-{doc.status}"
    return f"{doc.id}-{REVIEWED}-{review_id}"


def payload(
    settings: Settings, doc: models.Document, attempt: int, review_id: int | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "delivery": delivery_id(doc, review_id),
        "event": "finished" if review_id is None else REVIEWED,
        "attempt": attempt,
        "id": doc.id,
        "status": doc.status,
        "reason": public_reason(doc.reason),  # no store URI leaves the fleet
        "pages": {
            "total": doc.page_count,
            "done": doc.pages_done,
            "failed": doc.pages_failed,
        },
        "metadata": doc.meta,
        "results": result_urls(settings, doc.id)
        if doc.status in ("done", "partial", "reviewed")
        else {},
    }
    if review_id is not None:
        body["review"] = {"id": review_id}
    return body


@dataclass(frozen=True)
class Attempt:
    """What one delivery attempt did: `final` when no further attempt is due."""

    attempt: int
    delivered: bool
    final: bool
    status_code: int | None = None
    error: str | None = None


def _signing_key(session: Session, settings: Settings, doc: models.Document) -> tuple[str, str]:
    """(key id, secret) that sign the document's webhooks: its API key's own secret, or for
    a document submitted without a key, OCRFLEET_WEBHOOK_SECRET."""
    if doc.webhook_key_id is not None:
        secret = session.scalar(
            select(models.ApiKey.webhook_secret).where(models.ApiKey.id == doc.webhook_key_id)
        )
        if secret:
            return str(doc.webhook_key_id), secret
        raise UnsafeCallbackURL(f"API key {doc.webhook_key_id} has no webhook secret")
    if not settings.webhook_secret:
        raise UnsafeCallbackURL("OCRFLEET_WEBHOOK_SECRET is not set: nothing to sign with")
    return FLEET_KEY_ID, settings.webhook_secret


def _finished(session: Session, document_id: int, delivery: str, max_attempts: int) -> bool:
    """Whether a `reviewed` delivery already got its 2xx, was refused, or ran out of tries."""
    d = models.Delivery
    ended = or_(d.status_code.between(200, 299), d.error.like("refused%"))
    attempts, ends = session.execute(
        select(func.count(d.id), func.count(d.id).filter(ended)).where(
            d.document_id == document_id, d.delivery == delivery
        )
    ).one()
    return ends > 0 or attempts >= max_attempts


def deliver(
    settings: Settings,
    document_id: int,
    review_id: int | None = None,
    *,
    resolver: Resolver | None = None,
) -> Attempt:
    """Make the next attempt of the document's completion webhook (or, with `review_id`,
    of its `reviewed` event) and record it; one that was delivered or given up (or never
    claimed) gets no request. The host is resolved once, by `resolver` (the system's by
    default), and the request goes to the address checked."""
    from ocrfleet.db.session import session_scope

    refused: str | None = None
    with session_scope(settings.database_url) as session:
        doc = session.get(models.Document, document_id)
        if doc is None or doc.callback_url is None:
            return Attempt(attempt=0, delivered=False, final=True, error="not due")
        delivery = delivery_id(doc, review_id)
        if review_id is None and doc.callback_state != "queued":
            return Attempt(attempt=0, delivered=False, final=True, error="not due")
        if review_id is not None and _finished(
            session, document_id, delivery, settings.webhook_max_attempts
        ):
            return Attempt(attempt=0, delivered=False, final=True, error="not due")
        attempt = 1 + (
            session.scalar(
                select(func.count(models.Delivery.id)).where(
                    models.Delivery.document_id == document_id,
                    models.Delivery.delivery == delivery,
                )
            )
            or 0
        )
        url = doc.callback_url
        event_name = doc.status if review_id is None else REVIEWED
        body = json.dumps(payload(settings, doc, attempt, review_id), sort_keys=True).encode()
        try:
            key_id, secret = _signing_key(session, settings, doc)
        except UnsafeCallbackURL as exc:
            refused = f"refused: {exc}"

    status_code: int | None = None
    error: str | None = refused
    if refused is None:
        deadline = time.monotonic() + settings.webhook_timeout_s
        try:
            target = outbound.resolve(
                url,
                allow_private=settings.webhook_allow_private,
                deadline=deadline,
                resolver=resolver,
            )
            status_code = outbound.post(
                target,
                body,
                {
                    "Content-Type": "application/json",
                    "User-Agent": "ocrfleet-webhook",
                    SIGNATURE_HEADER: sign(secret, body, key_id=key_id),
                },
                deadline=deadline,
            )
        except UnsafeCallbackURL as exc:
            error = f"refused: {exc}"
        except outbound.DeadlineExceeded as exc:
            error = f"DeadlineExceeded: {exc}"
        except (OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:1000]

    delivered = status_code is not None and 200 <= status_code < 300
    final = delivered or attempt >= settings.webhook_max_attempts or (
        error is not None and error.startswith("refused")
    )
    _count(str(event_name), delivered, final, status_code, error)
    with session_scope(settings.database_url) as session:
        session.add(
            models.Delivery(
                document_id=document_id,
                delivery=delivery,
                attempt=attempt,
                url=url,
                event=event_name,
                status_code=status_code,
                error=error,
            )
        )
        if final and review_id is None:
            session.execute(
                update(models.Document)
                .where(models.Document.id == document_id)
                .values(callback_state="delivered" if delivered else "gave_up")
            )
    return Attempt(attempt, delivered, final, status_code, error)


def _count(
    event_name: str, delivered: bool, final: bool, status_code: int | None, error: str | None
) -> None:
    refused = error is not None and error.startswith("refused")
    if not delivered:
        if status_code is not None:
            failure = f"http_{status_code // 100}xx"
        elif refused:
            failure = "refused"
        elif error is not None and error.startswith("DeadlineExceeded"):
            failure = "timeout"
        else:
            failure = "connection"
        FAILURES.labels(event_name, failure).inc()
    if final:
        outcome = "delivered" if delivered else "refused" if refused else "gave_up"
        DELIVERIES.labels(event_name, outcome).inc()


def backoff_s(settings: Settings, attempt: int) -> float:
    """Delay before attempt `attempt + 1`: the base doubling, capped."""
    return min(settings.webhook_backoff_s * 2 ** (attempt - 1), settings.webhook_backoff_max_s)
