"""Recovery sweeps: find work the fleet lost track of and put it back. Run by the one
elected `ocrfleet.tasks.sweeper.Sweeper` of the fleet, each on its period.

- **orphans**: a worker's main process that dies by SIGKILL (OOM, host crash) leaves the
  messages it held in Redis' `unacked` hash, where kombu would restore them only after the
  visibility timeout (an hour by default). A message there that no live heartbeat claims
  (`ocrfleet.tasks.heartbeat`), and that is older than a few heartbeats, is put back
  at the head of its queue, as kombu's own restore does, flagged redelivered. The page's
  delivery count lives in the database and is not reset, so a poison page still ends
  `failed`.
- **lost**: after a Redis data loss, or a submit whose broker was down, a `pending` page or
  document has no message anywhere. One that has none in any queue or in `unacked` and
  has not moved for `sweep_lost_after_s` is enqueued again, at the head of its queue.
- **intake**: objects under `OCRFLEET_INTAKE_PREFIX` that were dropped in the store without
  a submit are submitted once (the document's sha256 + run is the dedup key); one in a
  tenant's intake prefix (`<store>/intake/<tenant>/...`) as that tenant's.
- **retention**: page images derived from documents finished more than
  `page_image_retention_days` ago are deleted.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from sqlalchemy import select

from ocrfleet import ir, states
from ocrfleet.config import Settings, get_settings
from ocrfleet.db import models
from ocrfleet.db.session import session_scope
from ocrfleet.scheduler.signals import (
    QUEUES,
    UNACKED_INDEX_KEY,
    UNACKED_KEY,
    sub_lists,
    unacked_entries,
    worker_signals,
)
from ocrfleet.tasks import routing

log = logging.getLogger(__name__)

ORPHAN_GRACE_PERIODS = 3  # heartbeats a fresh message may go unclaimed


def _conn(settings: Settings) -> redis.Redis:
    if not settings.broker_url:
        raise RuntimeError("OCRFLEET_BROKER_URL is not set")
    return redis.Redis.from_url(settings.broker_url, socket_timeout=10, socket_connect_timeout=5)


# -- orphans -------------------------------------------------------------------------------


def _restore(conn: redis.Redis, tag: str) -> str | None:
    """Move one unacked message back to the head of its queue, atomically (the same
    transaction kombu's `restore_by_tag` runs); returns the list it went to."""
    restored: list[str] = []

    def transaction(pipe: Any) -> None:
        raw = pipe.hget(UNACKED_KEY, tag)
        pipe.multi()
        pipe.zrem(UNACKED_INDEX_KEY, tag)
        pipe.hdel(UNACKED_KEY, tag)
        if raw:
            message, _exchange, routing_key = json.loads(raw)
            message.setdefault("headers", {})["redelivered"] = True
            message.setdefault("properties", {}).setdefault("delivery_info", {})["redelivered"] = (
                True
            )
            priority = int(message["properties"].get("priority") or 0)
            key = _priority_list(routing_key, priority)
            pipe.rpush(key, json.dumps(message))  # BRPOP takes from the right: the head
            restored.append(key)

    conn.transaction(transaction, UNACKED_KEY)
    return restored[0] if restored else None


def _priority_list(queue: str, priority: int) -> str:
    """kombu's list for `queue` at `priority` (its steps 0, 3, 6, 9)."""
    lists = sub_lists(queue)
    steps = (0, 3, 6, 9)
    index = max(i for i, step in enumerate(steps) if step <= max(0, min(priority, 9)))
    return lists[index]


def requeue_orphans(settings: Settings, now: float | None = None) -> list[str]:
    """Restore unacked messages no live worker holds; returns their delivery tags."""
    now = time.time() if now is None else now
    conn = _conn(settings)
    try:
        grace = ORPHAN_GRACE_PERIODS * settings.heartbeat_interval_s
        claimed = _claims(conn, now)
        restored = []
        for tag, score in conn.zrange(UNACKED_INDEX_KEY, 0, -1, withscores=True):
            tag = tag.decode() if isinstance(tag, bytes) else tag
            if tag in claimed or now - score < grace:
                continue
            # Re-read the claims just before acting: a worker may have taken it meanwhile.
            if tag in _claims(conn, now):
                continue
            queue = _restore(conn, tag)
            if queue is not None:
                log.warning("requeued orphaned message %s at the head of %r", tag, queue)
                restored.append(tag)
        return restored
    finally:
        conn.close()


def _claims(conn: redis.Redis, now: float) -> set[str]:
    return {
        str(held["tag"])
        for worker in worker_signals(conn, now)
        for held in worker.held
        if held.get("tag") is not None
    }


# -- lost ----------------------------------------------------------------------------------


def message_refs(message: dict[str, Any]) -> tuple[str | None, Any]:
    """(task name, page id or document id) of a Celery message payload."""
    headers = message.get("headers") or {}
    task = headers.get("task")
    try:
        body = message["body"]
        if (message.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args, kwargs, _embed = json.loads(body)
    except (KeyError, ValueError, TypeError, AttributeError):
        return task, None
    if task == routing.PAGE_TASK:
        return task, args[0] if args else None
    if task == routing.INGEST_TASK:
        return task, kwargs.get("document_id")
    return task, None


def referenced(conn: redis.Redis) -> tuple[set[int], set[int]]:
    """Page ids and document ids that some message (queued or unacked) refers to."""
    pages: set[int] = set()
    documents: set[int] = set()

    def note(message: dict[str, Any]) -> None:
        task, ref = message_refs(message)
        if ref is None:
            return
        (pages if task == routing.PAGE_TASK else documents).add(int(ref))

    for queue in QUEUES:
        for key in sub_lists(queue):
            for raw in conn.lrange(key, 0, -1):
                try:
                    note(json.loads(raw))
                except ValueError:
                    continue
    for message, _exchange, _routing_key in unacked_entries(conn).values():
        note(message)
    return pages, documents


def _held_pages(conn: redis.Redis) -> set[int]:
    """Pages a live worker's heartbeat says it holds (after a Redis data loss its message
    is in no list and no `unacked` hash, but the page is in hand)."""
    return {
        int(held["args"][0])
        for worker in worker_signals(conn)
        for held in worker.held
        if held.get("task") == routing.PAGE_TASK and held.get("args")
    }


def _to_head(conn: redis.Redis, queue: str, task_id: str) -> None:
    """Move a just-published message (at the tail, the left end) to the head."""
    script = """
    for _, value in ipairs(redis.call('LRANGE', KEYS[1], 0, 200)) do
        if string.find(value, ARGV[1], 1, true) then
            redis.call('LREM', KEYS[1], 1, value)
            redis.call('RPUSH', KEYS[1], value)
            return 1
        end
    end
    return 0
    """
    conn.eval(script, 1, queue, task_id)


def requeue_lost(
    settings: Settings, now: float | None = None, lost_after_s: float | None = None
) -> dict[str, list[int]]:
    """Enqueue pending pages and documents that no message refers to any more and that
    have not moved for `lost_after_s` (default `sweep_lost_after_s`)."""
    from ocrfleet.tasks.app import create_app

    now_dt = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    if lost_after_s is None:
        lost_after_s = settings.sweep_lost_after_s
    before = now_dt - timedelta(seconds=lost_after_s)
    doc, page = models.Document, models.Page
    with session_scope(settings.database_url) as session:
        pages = session.execute(
            select(page.id, doc.priority)
            .join(doc, doc.id == page.document_id)
            .where(page.status == ir.PageStatus.pending, page.updated_at < before)
            .where(doc.status == ir.DocumentStatus.processing)
        ).all()
        documents = session.execute(
            select(doc.id, doc.source_uri, doc.priority, doc.meta, doc.run_id).where(
                doc.status == ir.DocumentStatus.pending, doc.updated_at < before
            )
        ).all()
    if not pages and not documents:
        return {"pages": [], "documents": []}
    conn = _conn(settings)
    app = create_app(settings)
    try:
        page_refs, doc_refs = referenced(conn)
        page_refs |= _held_pages(conn)  # running or reserved: its message is a worker's
        requeued: dict[str, list[int]] = {"pages": [], "documents": []}
        for page_id, priority in pages:
            if page_id in page_refs:
                continue
            queue = routing.page_queue(priority)
            result = app.send_task(routing.PAGE_TASK, args=[page_id], queue=queue)
            _to_head(conn, queue, result.id)
            requeued["pages"].append(page_id)
        for doc_id, uri, priority, meta, run_id in documents:
            if doc_id in doc_refs:
                continue
            queue = routing.ingest_queue(priority)
            result = app.send_task(
                routing.INGEST_TASK,
                args=[uri],
                kwargs={
                    "priority": priority,
                    "metadata": meta,
                    "document_id": doc_id,
                    "run_id": run_id,
                },
                queue=queue,
            )
            _to_head(conn, queue, result.id)
            requeued["documents"].append(doc_id)
        if requeued["pages"] or requeued["documents"]:
            log.warning("requeued lost work: %s", requeued)
        return requeued
    finally:
        conn.close()


# -- intake and retention ------------------------------------------------------------------


def ingest_intake(settings: Settings) -> list[int]:
    """Submit every object under the intake prefix that is not a document yet."""
    from ocrfleet import client
    from ocrfleet.storage import open_store
    from ocrfleet.storage.sources import tenant_of

    prefix = settings.intake_prefix
    if not prefix:
        return []
    if prefix.startswith(("s3://", "file://")):
        store, key_prefix = open_store(settings, prefix), ""
    else:
        store, key_prefix = open_store(settings), prefix
    with session_scope(settings.database_url) as session:
        known = set(session.scalars(select(models.Document.source_uri)).all())
    submitted = []
    for key in store.list(key_prefix):
        uri = store.uri(key)
        if uri in known:
            continue
        tenant = tenant_of(uri, settings)
        meta = {models.TENANT_FIELD: tenant} if tenant else None
        try:
            submitted.append(client.submit(uri, metadata=meta, settings=settings))
        except Exception as exc:  # one bad object must not stop the others
            log.error("cannot submit intake object %s: %s", uri, exc)
    return submitted


def expire_page_images(settings: Settings, now: float | None = None) -> int:
    """Delete derived page images of documents finished before the retention period."""
    from ocrfleet.storage import open_store

    days = settings.page_image_retention_days
    if days <= 0:
        return 0
    now_dt = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    doc, page = models.Document, models.Page
    terminal = [s.value for s in states.TERMINAL]
    with session_scope(settings.database_url) as session:
        uris = session.scalars(
            select(page.image_uri)
            .join(doc, doc.id == page.document_id)
            .where(doc.status.in_(terminal), doc.updated_at < now_dt - timedelta(days=days))
            .where(page.image_uri != "")
        ).all()
    store = open_store(settings)
    deleted = 0
    for uri in uris:
        try:
            key = store.key_of(uri)
        except ValueError:
            continue
        if store.exists(key):
            store.delete(key)
            deleted += 1
    return deleted


def run_sweep(name: str, settings: Settings | None = None) -> Any:
    settings = settings or get_settings()
    return SWEEPS[name](settings)


SWEEPS = {
    "orphans": requeue_orphans,
    "lost": requeue_lost,
    "intake": ingest_intake,
    "retention": expire_page_images,
}
