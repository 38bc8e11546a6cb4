"""What the scheduler sees, read cheaply and often: one `Snapshot` per tick.

Queue depths come straight from Redis the way kombu lays them out: a queue `gpu` is the
list `gpu` plus one list per priority step (`gpu\\x06\\x163`, ...\\x166, ...\\x169), and a
message a worker has taken but not acknowledged (acks_late) sits in the `unacked` hash
(delivery tag -> [message, exchange, routing key]) until the task ends. A busy fleet
therefore shows empty lists; the unacked hash is the work in flight.

Page ages and counts, and the units finished so far (pages read, documents split), come
from the database; worker liveness, what each worker runs now and its model load time from
the heartbeats the workers write (`ocrfleet.tasks.heartbeat`). Rates are the policy's to
measure from these, over windows of ticks (`ocrfleet.scheduler.rates`).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict
from sqlalchemy import func, or_, select

from ocrfleet import states
from ocrfleet.db import models
from ocrfleet.db.session import session_scope
from ocrfleet.ir import DocumentStatus, PageStatus
from ocrfleet.tasks import routing
from ocrfleet.tasks.heartbeat import READY_PREFIX, WAITING_KEY, WORKER_PREFIX

# kombu.transport.redis: Channel.sep, PRIORITY_STEPS, unacked_key.
PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)
UNACKED_KEY = "unacked"
UNACKED_INDEX_KEY = "unacked_index"

QUEUES: tuple[str, ...] = tuple(name for pair in routing.ROLES.values() for name in pair)
# Work of a run put back this recently, by a worker of another run, still waits for a
# worker of its own (workers refresh the entry at least every RUN_WAIT_S while it waits).
WAITING_FRESH_S = 60.0


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class QueueSignal(_Frozen):
    name: str
    waiting: int  # in the list and its priority sub-lists
    unacked: int  # taken by a worker, not acknowledged yet


class WorkerSignal(_Frozen):
    hostname: str
    queues: list[str]
    age_s: float  # since the last heartbeat
    load_s: float | None  # model load time its pool process measured
    busy: bool
    held: list[dict[str, Any]] = []
    run_id: str | None = None  # the run its pool reads pages for (None: ingest only)

    @property
    def role(self) -> str:
        return "gpu" if any(q.startswith("gpu") for q in self.queues) else "ingest"


class Snapshot(_Frozen):
    taken_at: float  # epoch seconds
    queues: dict[str, QueueSignal]
    oldest_age_s: dict[str, float | None]  # priority -> age of the oldest unfinished document
    pending_pages: dict[str, int]  # priority -> pages not finished
    pages: dict[str, int]  # page status -> count
    pages_total: int  # every page ever made: its increase is the arrival rate
    pending_documents: int  # submitted, not split yet (their pages are not counted)
    pages_finished: int  # pages a worker read to the end (done or failed)
    documents_total: int  # every document ever submitted: its increase is ingest's arrivals
    documents_split: int  # documents an ingest worker is through with
    workers: list[WorkerSignal]
    runs_waiting: dict[str, float] = {}  # run -> when a worker of another run last put it back

    def unserved_runs(self) -> list[str]:
        """Runs whose work waits while no live worker reads pages for them: a mismatch of
        images or settings that no pool size fixes, so it is reported, not scaled for."""
        served = {w.run_id for w in self.workers if w.run_id}
        return sorted(
            run
            for run, at in self.runs_waiting.items()
            if self.taken_at - at <= WAITING_FRESH_S and run not in served
        )

    def backlog(self, role: str) -> int:
        """Messages of `role` waiting or in flight, both priorities."""
        return sum(
            self.queues[q].waiting + self.queues[q].unacked
            for q in routing.ROLES[role]
            if q in self.queues
        )

    def live(self, role: str) -> list[WorkerSignal]:
        return [w for w in self.workers if w.role == role]

    def running(self, task: str) -> int:
        """Tasks named `task` a worker has started and not finished (not those reserved)."""
        return sum(
            1
            for w in self.workers
            for h in w.held
            if h.get("task") == task and h.get("started") is not None
        )


def sub_lists(queue: str) -> list[str]:
    """The Redis lists that hold `queue`'s messages, one per kombu priority step."""
    return [queue if step == 0 else f"{queue}{PRIORITY_SEP}{step}" for step in PRIORITY_STEPS]


def queue_signals(conn: redis.Redis, queues: tuple[str, ...] = QUEUES) -> dict[str, QueueSignal]:
    pipe = conn.pipeline(transaction=False)
    for queue in queues:
        for key in sub_lists(queue):
            pipe.llen(key)
    lengths = pipe.execute()
    unacked = unacked_by_queue(conn)
    steps = len(PRIORITY_STEPS)
    return {
        queue: QueueSignal(
            name=queue,
            waiting=int(sum(lengths[i * steps : (i + 1) * steps])),
            unacked=unacked.get(queue, 0),
        )
        for i, queue in enumerate(queues)
    }


def unacked_entries(conn: redis.Redis) -> dict[str, tuple[dict[str, Any], str, str]]:
    """delivery tag -> (message, exchange, routing key) for every unacknowledged message."""
    found = {}
    for tag, raw in conn.hgetall(UNACKED_KEY).items():
        try:
            message, exchange, routing_key = json.loads(raw)
        except (ValueError, TypeError):
            continue
        found[tag.decode() if isinstance(tag, bytes) else tag] = (message, exchange, routing_key)
    return found


def unacked_by_queue(conn: redis.Redis) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _message, _exchange, routing_key in unacked_entries(conn).values():
        counts[routing_key] = counts.get(routing_key, 0) + 1
    return counts


def worker_signals(conn: redis.Redis, now: float | None = None) -> list[WorkerSignal]:
    """Workers whose heartbeat has not expired."""
    now = time.time() if now is None else now
    keys = sorted(conn.scan_iter(match=f"{WORKER_PREFIX}*", count=500))
    if not keys:
        return []
    beats = conn.mget(keys)
    hostnames = [k.decode().removeprefix(WORKER_PREFIX) for k in keys]
    ready = conn.mget([f"{READY_PREFIX}{h}" for h in hostnames])
    workers = []
    for hostname, raw, ready_raw in zip(hostnames, beats, ready, strict=True):
        if raw is None:
            continue
        beat = json.loads(raw)
        ready_record = json.loads(ready_raw) if ready_raw else {}
        held = beat.get("held") or []
        workers.append(
            WorkerSignal(
                hostname=hostname,
                queues=beat.get("queues") or [],
                age_s=max(0.0, now - float(beat.get("ts", now))),
                load_s=ready_record.get("load_s"),
                run_id=ready_record.get("run_id"),
                busy=any(h.get("task") == routing.PAGE_TASK for h in held),
                held=held,
            )
        )
    return workers


def runs_waiting(conn: redis.Redis) -> dict[str, float]:
    """Runs whose work a worker of another run put back, with when it last did."""
    return {
        run.decode(): float(json.loads(raw).get("at", 0.0))
        for run, raw in conn.hgetall(WAITING_KEY).items()
    }


def _epoch(value: datetime | None) -> float | None:
    if value is None:
        return None
    if value.tzinfo is None:  # SQLite returns naive UTC
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def database_signals(database_url: str, now: float) -> dict[str, Any]:
    """Live work only: unfinished documents and the pending pages of those being processed
    (a cancelled document's pages are `cancelled`, never backlog)."""
    doc, page = models.Document, models.Page
    unfinished = [status.value for status in states.UNFINISHED]
    with session_scope(database_url) as session:
        oldest = dict(
            session.execute(
                select(doc.priority, func.min(doc.created_at))
                .where(doc.status.in_(unfinished))
                .group_by(doc.priority)
            ).all()
        )
        pending_pages = dict(
            session.execute(
                select(doc.priority, func.count(page.id))
                .join(page, page.document_id == doc.id)
                .where(page.status == PageStatus.pending.value)
                .where(doc.status == DocumentStatus.processing.value)
                .group_by(doc.priority)
            ).all()
        )
        by_status = dict(
            session.execute(select(page.status, func.count()).group_by(page.status)).all()
        )
        pending_documents = session.scalar(
            select(func.count()).select_from(doc).where(doc.status == DocumentStatus.pending.value)
        )
    ages: dict[str, float | None] = {}
    for priority in routing.PRIORITIES:
        created = _epoch(oldest.get(priority))
        ages[priority] = None if created is None else max(0.0, now - created)
    return {
        "oldest_age_s": ages,
        "pending_pages": {p: int(pending_pages.get(p, 0)) for p in routing.PRIORITIES},
        "pages": {status: int(n) for status, n in by_status.items()},
        "pages_total": int(sum(by_status.values())),
        "pending_documents": int(pending_documents or 0),
    }


def finished_signals(database_url: str) -> dict[str, int]:
    """Cumulative counts of what the pools have finished, and of documents ever submitted:
    their increases over a window are throughput and arrivals."""
    doc, page = models.Document, models.Page
    finished = (PageStatus.done.value, PageStatus.failed.value)
    # Through ingest: split (a page count), or failed or rejected reading it. A document
    # cancelled before it was split never reached an ingest worker.
    split = or_(
        doc.page_count.is_not(None),
        doc.status.in_((DocumentStatus.failed.value, DocumentStatus.rejected.value)),
    )
    with session_scope(database_url) as session:
        pages = session.scalar(
            select(func.count()).select_from(page).where(page.status.in_(finished))
        )
        total, through = session.execute(
            select(
                func.count(),
                func.count().filter(doc.status != DocumentStatus.pending.value, split),
            ).select_from(doc)
        ).one()
    return {
        "pages_finished": int(pages or 0),
        "documents_total": int(total or 0),
        "documents_split": int(through or 0),
    }


def read_snapshot(conn: redis.Redis, database_url: str, now: float | None = None) -> Snapshot:
    """Everything the policy decides on, at one moment."""
    now = time.time() if now is None else now
    return Snapshot(
        taken_at=now,
        queues=queue_signals(conn),
        workers=worker_signals(conn, now),
        runs_waiting=runs_waiting(conn),
        **database_signals(database_url, now),
        **finished_signals(database_url),
    )
