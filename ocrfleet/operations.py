"""What an operator asks of a running fleet: what is stuck and why, and retry failures.

`stuck()` lists every row with work left (a `pending` or `processing` document, a `pending`
page) that has not changed for an age, each with where its message is (waiting in a queue,
taken by a live worker, unacknowledged by a worker that stopped heartbeating, or nowhere)
and why it is not moving: no live worker consumes its queue, only workers of another run
do, it is running on a worker since a time, the orphan or lost-work sweep will put it
back. `retry()` gives failed pages a fresh delivery budget and enqueues them; a document
that failed before it was split is enqueued for ingest again.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
from sqlalchemy import func, select

from ocrfleet import ir, states
from ocrfleet.config import Settings
from ocrfleet.db import models
from ocrfleet.db.session import session_scope
from ocrfleet.scheduler.signals import (
    QUEUES,
    WorkerSignal,
    sub_lists,
    unacked_entries,
    worker_signals,
)
from ocrfleet.tasks import routing
from ocrfleet.tasks.heartbeat import ready_key
from ocrfleet.tasks.sweeps import message_refs


@dataclass(frozen=True)
class StuckItem:
    kind: str  # "document" or "page"
    document_id: int
    page: int | None
    page_id: int | None
    status: str
    age_s: float  # since the row last changed
    deliveries: int | None
    where: str  # where its message is
    reason: str  # why it is not moving

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Message:
    """Where one task's message is: queued, or held by a worker (or by none)."""

    queue: str
    held_by: str | None = None  # a live worker's hostname
    started: bool = False
    orphaned: bool = False  # unacknowledged, held by no live worker


@dataclass
class _Fleet:
    """The broker's side of a fleet at one moment."""

    messages: dict[tuple[str, int], _Message] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)  # queue -> messages in it
    workers: list[WorkerSignal] = field(default_factory=list)
    runs: dict[str, str] = field(default_factory=dict)  # hostname -> the run it reads pages of


def _read_fleet(conn: redis.Redis) -> _Fleet:
    fleet = _Fleet(workers=worker_signals(conn))
    for queue in QUEUES:
        fleet.waiting[queue] = 0
        for key in sub_lists(queue):
            for raw in conn.lrange(key, 0, -1):
                fleet.waiting[queue] += 1
                task, ref = message_refs(json.loads(raw))
                if task is not None and ref is not None:
                    fleet.messages[(task, int(ref))] = _Message(queue)
    holders = {
        str(held["tag"]): (worker.hostname, held)
        for worker in fleet.workers
        for held in worker.held
        if held.get("tag") is not None
    }
    for tag, (message, _exchange, queue) in unacked_entries(conn).items():
        task, ref = message_refs(message)
        if task is None or ref is None:
            continue
        if tag in holders:
            hostname, held = holders[tag]
            found = _Message(queue, hostname, started=bool(held.get("started")))
        else:
            found = _Message(queue, orphaned=True)
        fleet.messages[(task, int(ref))] = found
    if fleet.workers:  # the run each worker reads pages of, as its pool published it
        ready = conn.mget([ready_key(w.hostname) for w in fleet.workers])
        for worker, raw in zip(fleet.workers, ready, strict=True):
            run = json.loads(raw).get("run_id") if raw else None
            if run:
                fleet.runs[worker.hostname] = str(run)
    return fleet


def _age(value: datetime, now: float) -> float:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return max(0.0, now - value.timestamp())


def _clock(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _diagnose(
    fleet: _Fleet | None, message: _Message | None, run_id: str, since: datetime, lost_s: float
) -> tuple[str, str]:
    """(where, why) of one unfinished row whose task is `message`."""
    if fleet is None:
        return "no broker", "OCRFLEET_BROKER_URL is not set: no fleet runs it"
    if message is None:
        return (
            "no message",
            f"no message refers to it: the lost-work sweep re-enqueues it "
            f"once it is {lost_s:.0f}s old",
        )
    if message.orphaned:
        return (
            f"unacked from {message.queue}, held by no live worker",
            "its worker stopped heartbeating: the orphan sweep requeues it",
        )
    if message.held_by is not None:
        if message.started:
            return (
                f"running on {message.held_by}",
                f"running on {message.held_by} since {_clock(since)}",
            )
        return (
            f"reserved by {message.held_by}",
            f"reserved by {message.held_by}, which has not started it yet",
        )
    where = f"queued in {message.queue}"
    consumers = [w for w in fleet.workers if message.queue in w.queues]
    if not consumers:
        return where, f"no live worker consumes {message.queue}"
    runs = {fleet.runs.get(w.hostname) for w in consumers}
    if run_id not in runs and None not in runs:
        theirs = ", ".join(sorted(r[:12] for r in runs if r))
        return where, f"waiting for a worker of run {run_id[:12]} (live workers run {theirs})"
    waiting = fleet.waiting.get(message.queue, 0)
    return where, f"one of {waiting} message(s) waiting for {len(consumers)} live worker(s)"


def stuck(settings: Settings, older_than_s: float, now: float | None = None) -> list[StuckItem]:
    """Every row with work left that has not changed for `older_than_s`: unfinished
    documents, and pending pages, each with where its message is and why it waits."""
    now = time.time() if now is None else now
    cutoff = datetime.fromtimestamp(now - older_than_s, UTC)
    doc, page = models.Document, models.Page
    pending = ir.PageStatus.pending.value
    with session_scope(settings.database_url) as session:
        left = dict(
            session.execute(
                select(page.document_id, func.count())
                .where(page.status == pending)
                .group_by(page.document_id)
            ).all()
        )
        docs = session.execute(
            select(doc.id, doc.status, doc.run_id, doc.page_count, doc.updated_at)
            .where(doc.status.in_([s.value for s in states.UNFINISHED]), doc.updated_at < cutoff)
            .order_by(doc.id)
        ).all()
        pages = session.execute(
            select(
                page.id,
                page.document_id,
                page.number,
                page.deliveries,
                page.updated_at,
                doc.status.label("document_status"),
                doc.run_id,
            )
            .join(doc, doc.id == page.document_id)
            .where(page.status == pending, page.updated_at < cutoff)
            .order_by(page.document_id, page.number)
        ).all()
    if not docs and not pages:
        return []
    fleet = None
    if settings.broker_url:
        conn = redis.Redis.from_url(settings.broker_url, socket_timeout=10)
        try:
            fleet = _read_fleet(conn)
        finally:
            conn.close()
    lost_s = settings.sweep_lost_after_s
    found: list[tuple[int, int, StuckItem]] = []
    for d in docs:
        if d.status == ir.DocumentStatus.pending:
            message = fleet.messages.get((routing.INGEST_TASK, d.id)) if fleet else None
            where, why = _diagnose(fleet, message, d.run_id, d.updated_at, lost_s)
        else:
            where = "split into pages"
            why = f"{left.get(d.id, 0)} of {d.page_count} page(s) pending"
        item = StuckItem(
            "document", d.id, None, None, d.status, _age(d.updated_at, now), None, where, why
        )
        found.append((d.id, 0, item))
    for p in pages:
        if p.document_status != ir.DocumentStatus.processing:
            where, why = "no message", f"its document is {p.document_status}: nothing runs it"
        else:
            message = fleet.messages.get((routing.PAGE_TASK, p.id)) if fleet else None
            where, why = _diagnose(fleet, message, p.run_id, p.updated_at, lost_s)
        item = StuckItem(
            "page",
            p.document_id,
            p.number,
            p.id,
            pending,
            _age(p.updated_at, now),
            p.deliveries,
            where,
            why,
        )
        found.append((p.document_id, p.number, item))
    return [item for _doc, _number, item in sorted(found, key=lambda f: (f[0], f[1]))]


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
                if states.move(
                    session, doc, ir.DocumentStatus.pending, doc.id == doc_id, reason=None
                ):
                    results.append(Retried(doc_id, [], True))
                continue
            page_ids = states.move(
                session,
                page,
                ir.PageStatus.pending,
                page.document_id == doc_id,
                page.status == ir.PageStatus.failed.value,
                deliveries=0,
                reason=None,
            )
            if not page_ids:
                continue
            states.move(
                session,
                doc,
                ir.DocumentStatus.processing,
                doc.id == doc_id,
                pages_failed=doc.pages_failed - len(page_ids),
                reason=None,
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
