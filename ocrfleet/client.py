"""What an upload service imports: `submit()`, `status()`, `wait()`, `cancel()`,
`result()`. No torch, no models.

`submit` makes the document's row itself, as `pending`, keyed on (sha256, run_id, tenant)
like every document (the tenant is `metadata["tenant"]`, "" for none), then uploads the
bytes to `intake/<sha256>` and enqueues `ocrfleet.ingest` by name. So it returns the
document id at once, and the same content submitted twice by one tenant is the same
document (the second submit enqueues nothing unless the first never got past `pending`);
another tenant's submission of it is another document. The run id is `OCRFLEET_RUN_ID`
when pinned (registered when a worker of it starts, or by `ocrfleet run-id --register`,
so an upload service needs no engine files), else computed here from the settings alone
(`runs.run_config` loads no model, but hashes the model files, and takes only the libraries
the configured engines use: an install without torch computes a CPU run as workers with it
do); a worker of another run leaves the document for a worker of its run.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import kombu.exceptions
import redis.exceptions
from sqlalchemy import select
from sqlalchemy.orm import Session

from ocrfleet import ir, states
from ocrfleet.config import Settings, get_settings
from ocrfleet.db import models
from ocrfleet.db.session import session_scope
from ocrfleet.db.upsert import upsert
from ocrfleet.runs import ensure_run, run_config, run_id_of
from ocrfleet.storage import ObjectStore, open_store, read_uri
from ocrfleet.storage.local import display_uri
from ocrfleet.tasks import routing

INTAKE_PREFIX = "intake"
CANCELLED = "cancelled on request"  # the reason of a cancelled document and its pages


class SubmitError(RuntimeError):
    """The fleet cannot take this submission (no broker configured, unreadable input)."""


class BrokerUnavailable(SubmitError):
    """The document row exists (`pending`) but its message could not be sent."""


# A few quick tries: a submitter is told within seconds, and the row is not lost (the
# `lost` recovery sweep enqueues pending documents that have no message).
SUBMIT_RETRY_POLICY = {
    "max_retries": 3,
    "interval_start": 0.2,
    "interval_step": 0.5,
    "interval_max": 1.0,
}


class UnreadableInput(SubmitError):
    """This one input cannot be read (vanished, no permission); others may still be."""


@dataclass(frozen=True)
class DocumentState:
    """One document's progress, as the database records it."""

    id: int
    status: ir.DocumentStatus
    sha256: str
    source_uri: str
    priority: str
    page_count: int | None
    pages_done: int
    pages_failed: int
    reason: str | None
    meta: dict[str, Any] | None

    @property
    def finished(self) -> bool:
        return self.status in states.TERMINAL

    @classmethod
    def of(cls, row: models.Document, session: Session | None = None) -> DocumentState:
        """The row's state; with a session, a `partial` document without a reason of its
        own gets its failed pages' reasons."""
        reason = row.reason
        if reason is None and row.status == ir.DocumentStatus.partial and session is not None:
            reason = _failed_pages_reason(session, row.id)
        return cls(
            id=row.id,
            status=ir.DocumentStatus(row.status),
            sha256=row.sha256,
            source_uri=row.source_uri,
            priority=row.priority,
            page_count=row.page_count,
            pages_done=row.pages_done,
            pages_failed=row.pages_failed,
            reason=reason,
            meta=row.meta,
        )


def _failed_pages_reason(session: Session, document_id: int) -> str | None:
    page = models.Page
    failed = session.execute(
        select(page.number, page.reason)
        .where(page.document_id == document_id, page.status == ir.PageStatus.failed)
        .order_by(page.number)
    ).all()
    if not failed:
        return None
    parts = [f"page {number}: {reason or 'failed'}" for number, reason in failed[:3]]
    more = f"; {len(failed) - 3} more" if len(failed) > 3 else ""
    return f"{len(failed)} page(s) failed: " + "; ".join(parts) + more


_stores: dict[str, ObjectStore] = {}
_runs: dict[str, tuple[str, dict[str, Any]]] = {}


def _store(settings: Settings) -> ObjectStore:
    key = settings.model_dump_json()
    if key not in _stores:
        _stores[key] = open_store(settings)
    return _stores[key]


def _run(settings: Settings) -> tuple[str, dict[str, Any]]:
    """The run to submit under: the pinned `OCRFLEET_RUN_ID` as the fleet registered it, or
    the hash of this process's own run configuration."""
    key = settings.model_dump_json()
    if key not in _runs:
        if settings.run_id is not None:
            with session_scope(settings.database_url) as session:
                run = session.get(models.Run, settings.run_id)
                if run is None:
                    raise SubmitError(
                        f"run {settings.run_id} (OCRFLEET_RUN_ID) is not registered: "
                        "a worker of that run registers it when it starts, or "
                        "`ocrfleet run-id --register` where its models are"
                    )
                _runs[key] = (run.id, run.config)
        else:
            config = run_config(settings)
            _runs[key] = (run_id_of(config), config)
    return _runs[key]


def _read_source(
    source: str | os.PathLike[str] | bytes, settings: Settings
) -> tuple[bytes, str | None, str | None]:
    """(bytes, URI the workers read if already stored, file name)."""
    if isinstance(source, bytes | bytearray | memoryview):
        return bytes(source), None, None
    text = os.fspath(source)
    if text.startswith(("s3://", "file://")):
        return read_uri(text, settings), text, None
    path = Path(text)
    try:
        # The name is metadata for people: undecodable bytes become \xNN escapes.
        return path.read_bytes(), None, display_uri(path.name)
    except OSError as exc:
        raise UnreadableInput(f"cannot read {display_uri(text)}: {exc.strerror}") from exc


def _hash_stream(stream: BinaryIO) -> tuple[str, int]:
    """(sha256, size) of a seekable binary file from where it is; leaves it there."""
    start, digest, size = stream.tell(), hashlib.sha256(), 0
    for block in iter(lambda: stream.read(1 << 20), b""):
        digest.update(block)
        size += len(block)
    stream.seek(start)
    return digest.hexdigest(), size


def submit(
    source: str | os.PathLike[str] | bytes | BinaryIO,
    *,
    priority: str = "normal",
    metadata: dict[str, Any] | None = None,
    callback_url: str | None = None,
    webhook_key_id: int | None = None,
    settings: Settings | None = None,
) -> int:
    """Submit a PDF or image (bytes, a seekable binary file, a path, or an s3:// / file://
    URI the workers can read); returns the document id. `priority="high"` is for
    interactive uploads. `metadata["tenant"]`, if any, names the tenant the document is
    kept under. `callback_url` gets a signed POST when the document finishes: signed with
    the webhook secret of API key `webhook_key_id` (the HTTP API passes the caller's), or
    without one, with OCRFLEET_WEBHOOK_SECRET."""
    from ocrfleet.webhooks import check_url

    settings = settings or get_settings()
    routing.check_priority(priority)
    if not settings.broker_url:
        raise SubmitError(
            "OCRFLEET_BROKER_URL is not set: there is no fleet to submit to "
            "(use `ocrfleet run` to process in-process)"
        )
    if callback_url is not None:
        if webhook_key_id is None and not settings.webhook_secret:
            raise SubmitError("a callback_url needs OCRFLEET_WEBHOOK_SECRET to sign with")
        check_url(
            callback_url,
            allow_private=settings.webhook_allow_private,
            timeout_s=settings.webhook_timeout_s,
        )
    if hasattr(source, "read"):  # a file: hashed, then streamed to the store
        data: bytes | BinaryIO = source  # type: ignore[assignment]
        uri, filename = None, None
        sha256, size = _hash_stream(source)  # type: ignore[arg-type]
    else:
        data, uri, filename = _read_source(source, settings)  # type: ignore[arg-type]
        sha256, size = hashlib.sha256(data).hexdigest(), len(data)  # type: ignore[arg-type]
    meta = dict(metadata or {})
    tenant = models.metadata_tenant(meta)
    if filename is not None:
        meta.setdefault("filename", filename)
    if uri is None:
        store = _store(settings)
        key = f"{INTAKE_PREFIX}/{sha256}"
        uri = store.uri(key) if store.exists(key) else store.put(key, data)
    del data

    run_id, config = _run(settings)
    with session_scope(settings.database_url) as session:
        ensure_run(session, config)
        document_id = upsert(
            session,
            models.Document,
            {
                "run_id": run_id,
                "sha256": sha256,
                "tenant": tenant,
                "source_uri": uri,
                "byte_size": size,
                "priority": priority,
                "meta": meta or None,
                "callback_url": callback_url,
                "webhook_key_id": webhook_key_id if callback_url is not None else None,
                "status": ir.DocumentStatus.pending.value,
            },
            key=models.DOCUMENT_KEY,
            update=[],
        )
        status = session.scalar(
            select(models.Document.status).where(models.Document.id == document_id)
        )

    if status == ir.DocumentStatus.pending:  # enqueue after the commit that made the row
        try:
            _app(settings).send_task(
                routing.INGEST_TASK,
                args=[uri],
                kwargs={
                    "priority": priority,
                    "metadata": meta or None,
                    "document_id": document_id,
                    "run_id": run_id,
                },
                queue=routing.ingest_queue(priority),
                retry_policy=SUBMIT_RETRY_POLICY,
            )
        except (kombu.exceptions.OperationalError, redis.exceptions.RedisError, OSError) as exc:
            raise BrokerUnavailable(
                f"document {document_id} is recorded as pending, but the broker is unreachable "
                f"({type(exc).__name__}: {exc}); the recovery sweep enqueues it once the "
                "broker is back"
            ) from exc
    return int(document_id)


def cancel(document_id: int, *, settings: Settings | None = None) -> DocumentState:
    """Cancel a document that is not finished: its pending pages become `cancelled` in the
    same transaction (workers skip their queued tasks, and nothing counts them as backlog),
    pages already running finish, and it ends `cancelled` (its webhook, if any, is sent
    now). A finished document is left as it is; LookupError if there is none."""
    from ocrfleet.webhooks import notify_finished

    settings = settings or get_settings()
    doc, page = models.Document, models.Page
    with session_scope(settings.database_url) as session:
        if session.get(doc, document_id) is None:
            raise LookupError(f"no document {document_id}")
        changed = states.move(
            session, doc, ir.DocumentStatus.cancelled, doc.id == document_id, reason=CANCELLED
        )
        if changed:
            states.move(
                session,
                page,
                ir.PageStatus.cancelled,
                page.document_id == document_id,
                reason=CANCELLED,
            )
    if changed:
        notify_finished(settings, document_id)
    return status(document_id, settings=settings)


def result(document_id: int, fmt: str = "text", *, settings: Settings | None = None) -> bytes:
    """The document's result in `fmt` (`ocrfleet.formats.FORMATS`: text, json, markdown,
    hocr, alto, pdf), rendered from the stored rows."""
    from ocrfleet.formats import render_document

    settings = settings or get_settings()
    with session_scope(settings.database_url) as session:
        if session.get(models.Document, document_id) is None:
            raise LookupError(f"no document {document_id}")
        store = _store(settings) if fmt == "pdf" else None
        return render_document(session, document_id, fmt, store)


def _app(settings: Settings) -> Any:
    from ocrfleet.tasks.app import create_app

    return create_app(settings)


def status(document_id: int, *, settings: Settings | None = None) -> DocumentState:
    settings = settings or get_settings()
    with session_scope(settings.database_url) as session:
        row = session.get(models.Document, document_id)
        if row is None:
            raise LookupError(f"no document {document_id}")
        return DocumentState.of(row, session)


def wait(
    document_id: int,
    timeout: float | None = None,
    *,
    settings: Settings | None = None,
    poll_s: float = 0.5,
    on_progress: Callable[[DocumentState], None] | None = None,
) -> DocumentState:
    """Block until the document is finished (`states.TERMINAL`)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        state = status(document_id, settings=settings)
        if on_progress is not None:
            on_progress(state)
        if state.finished:
            return state
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(
                f"document {document_id} is still {state.status.value} after {timeout}s "
                f"({state.pages_done + state.pages_failed}/{state.page_count or '?'} pages)"
            )
        time.sleep(poll_s)


def find(ref: str, *, settings: Settings | None = None) -> list[DocumentState]:
    """Documents named by `ref`: an id, a sha256, or the path of a submitted file."""
    settings = settings or get_settings()
    doc = models.Document
    if ref.isdigit():
        where = doc.id == int(ref)
    elif len(ref) == 64 and all(c in "0123456789abcdef" for c in ref):
        where = doc.sha256 == ref
    else:
        path = Path(ref)
        if not path.is_file():
            raise LookupError(f"{ref!r} is neither a document id, a sha256 nor a file")
        where = doc.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    with session_scope(settings.database_url) as session:
        rows = session.scalars(select(doc).where(where).order_by(doc.id)).all()
        return [DocumentState.of(row, session) for row in rows]


def recent(limit: int | None = 20, *, settings: Settings | None = None) -> list[DocumentState]:
    """The `limit` most recent documents, newest first (all of them for None)."""
    settings = settings or get_settings()
    doc = models.Document
    with session_scope(settings.database_url) as session:
        rows = session.scalars(select(doc).order_by(doc.id.desc()).limit(limit)).all()
        return [DocumentState.of(row, session) for row in rows]
