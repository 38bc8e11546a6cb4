"""What an operator asks of a running fleet: what is stuck and where, and retry failures.

`stuck()` lists documents and pages not finished after an age, each with where its
message is: waiting in a queue, taken by a live worker (running there), unacknowledged by
a worker that stopped heartbeating (the orphan sweep puts it back), or nowhere (the lost
sweep re-enqueues it). `retry()` gives failed pages a fresh delivery budget and enqueues
them; a document that failed before it was split is enqueued for ingest again.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from sqlalchemy import select, update

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.db import models
from ocrfleet.db.session import session_scope
from ocrfleet.scheduler.signals import QUEUES, sub_lists, unacked_entries, worker_signals
from ocrfleet.tasks import routing
from ocrfleet.tasks.sweeps import message_refs


@dataclass(frozen=True)
class StuckItem:
    kind: str  # "document" or "page"
    document_id: int
    page: int | None
    page_id: int | None
    status: str
    age_s: float
    deliveries: int | None
    where: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _locations(conn: redis.Redis) -> dict[tuple[str, int], str]:
    """(task, page or document id) -> where its message is."""
    found: dict[tuple[str, int], str] = {}
    for queue in QUEUES:
        for key in sub_lists(queue):
            for raw in conn.lrange(key, 0, -1):
                task, ref = message_refs(json.loads(raw))
                if task is not None and ref is not None:
                    found[(task, int(ref))] = f"queued in {queue}"
    holders = {
        str(held["tag"]): (worker.hostname, held)
        for worker in worker_signals(conn)
        for held in worker.held
        if held.get("tag") is not None
    }
    for tag, (message, _exchange, queue) in unacked_entries(conn).items():
        task, ref = message_refs(message)
        if task is None or ref is None:
            continue
        if tag in holders:
            hostname, held = holders[tag]
            state = "running on" if held.get("started") else "reserved by"
            found[(task, int(ref))] = f"{state} {hostname}"
        else:
            found[(task, int(ref))] = (
                f"unacked from {queue}, held by no live worker (the orphan sweep requeues it)"
            )
    return found


def _age(value: datetime, now: float) -> float:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return max(0.0, now - value.timestamp())


def stuck(settings: Settings, older_than_s: float, now: float | None = None) -> list[StuckItem]:
    """Unfinished documents older than `older_than_s`, with their unfinished pages."""
    now = time.time() if now is None else now
    cutoff = datetime.fromtimestamp(now - older_than_s, UTC)
    doc, page = models.Document, models.Page
    with session_scope(settings.database_url) as session:
        docs = session.execute(
            select(doc.id, doc.status, doc.created_at)
            .where(doc.status.in_(["pending", "processing"]), doc.created_at < cutoff)
            .order_by(doc.id)
        ).all()
        pages = session.execute(
            select(page.id, page.document_id, page.number, page.deliveries)
            .where(page.document_id.in_([d.id for d in docs]), page.status == "pending")
            .order_by(page.document_id, page.number)
        ).all()
    if not docs:
        return []
    where: dict[tuple[str, int], str] = {}
    if settings.broker_url:
        conn = redis.Redis.from_url(settings.broker_url, socket_timeout=10)
        try:
            where = _locations(conn)
        finally:
            conn.close()
    nowhere = "no message (the lost-work sweep re-enqueues it)"
    items = []
    for d in docs:
        age = _age(d.created_at, now)
        items.append(
            StuckItem(
                "document",
                d.id,
                None,
                None,
                d.status,
                age,
                None,
                where.get((routing.INGEST_TASK, d.id), nowhere)
                if d.status == "pending"
                else "split into pages",
            )
        )
        for p in (p for p in pages if p.document_id == d.id):
            items.append(
                StuckItem(
                    "page",
                    d.id,
                    p.number,
                    p.id,
                    "pending",
                    age,
                    p.deliveries,
                    where.get((routing.PAGE_TASK, p.id), nowhere),
                )
            )
    return items


@dataclass(frozen=True)
class Retried:
    document_id: int
    pages: list[int]  # page ids enqueued again
    ingest: bool  # the document itself was enqueued for ingest again


def retry(
    settings: Settings, document_ids: list[int] | None = None, since: datetime | None = None
) -> list[Retried]:
    """Reset failed pages (fresh delivery budget) of the given documents, or of every
    failed/partial document updated since `since`, and enqueue them after the commit."""
    from ocrfleet.tasks.app import create_app

    doc, page = models.Document, models.Page
    failed = [ir.DocumentStatus.failed.value, ir.DocumentStatus.partial.value]
    query = select(doc.id, doc.page_count).where(doc.status.in_(failed))
    if document_ids is not None:
        query = query.where(doc.id.in_(document_ids))
    if since is not None:
        query = query.where(doc.updated_at >= since)
    results: list[Retried] = []
    with session_scope(settings.database_url) as session:
        for doc_id, page_count in session.execute(query).all():
            if page_count is None:  # failed before it was split: ingest it again
                session.execute(
                    update(doc)
                    .where(doc.id == doc_id)
                    .values(status=ir.DocumentStatus.pending.value, reason=None)
                )
                results.append(Retried(doc_id, [], True))
                continue
            page_ids = list(
                session.scalars(
                    update(page)
                    .where(page.document_id == doc_id, page.status == ir.PageStatus.failed)
                    .values(status=ir.PageStatus.pending.value, deliveries=0, reason=None)
                    .returning(page.id)
                ).all()
            )
            if not page_ids:
                continue
            session.execute(
                update(doc)
                .where(doc.id == doc_id)
                .values(
                    pages_failed=doc.pages_failed - len(page_ids),
                    status=ir.DocumentStatus.processing.value,
                    reason=None,
                )
            )
            results.append(Retried(doc_id, sorted(page_ids), False))
        retried_ids = [r.document_id for r in results]
        rows = {r.id: r for r in session.scalars(select(doc).where(doc.id.in_(retried_ids)))}
        sends = [
            (r, row.priority, row.source_uri, row.meta, row.run_id)
            for r in results
            for row in [rows[r.document_id]]
        ]
    if results and not settings.broker_url:
        raise RuntimeError("OCRFLEET_BROKER_URL is not set: nothing can run the retried pages")
    app = create_app(settings) if results else None
    for retried, priority, uri, meta, run_id in sends:
        assert app is not None
        for page_id in retried.pages:
            app.send_task(routing.PAGE_TASK, args=[page_id], queue=routing.page_queue(priority))
        if retried.ingest:
            app.send_task(
                routing.INGEST_TASK,
                args=[uri],
                kwargs={
                    "priority": priority,
                    "metadata": meta,
                    "document_id": retried.document_id,
                    "run_id": run_id,
                },
                queue=routing.ingest_queue(priority),
            )
    return results
