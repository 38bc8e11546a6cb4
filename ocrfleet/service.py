"""The two units of work, shared by `ocrfleet run` (in-process) and the Celery tasks.

`ingest` turns an input URI into a document with page images in the store and page rows;
`process_page` OCRs one page and writes everything it produced in one transaction. Both are
idempotent: every write is an upsert on a natural key and a finished page is never redone,
so at-least-once delivery changes nothing."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ocrfleet import ir, states
from ocrfleet.config import Settings
from ocrfleet.db import models
from ocrfleet.db.persist import save_page_result
from ocrfleet.db.rule_flags import flag_document, flag_page
from ocrfleet.db.session import session_scope
from ocrfleet.db.upsert import upsert
from ocrfleet.errors import describe, is_transient
from ocrfleet.pipeline.images import InputRejected
from ocrfleet.pipeline.rules import RuleSet, load_rules
from ocrfleet.pipeline.sandbox import Split, split_document
from ocrfleet.runs import (
    OtherRun,
    canonical_json,
    check_pin,
    ensure_run,
    registered,
    run_config,
    run_id_of,
)
from ocrfleet.storage import ObjectStore, StorageError, open_store, read_uri
from ocrfleet.storage.local import display_uri, storable_uri
from ocrfleet.toolkit import Toolkit, drop_toolkits, get_toolkit

if TYPE_CHECKING:
    from ocrfleet.pipeline.page import ProcessedPage

log = logging.getLogger(__name__)


@dataclass
class Context:
    """What one process needs for the units of work; everything heavy is loaded lazily."""

    settings: Settings
    _run_id: str | None = field(default=None, init=False)

    @cached_property
    def store(self) -> ObjectStore:
        return open_store(self.settings)

    @cached_property
    def toolkit(self) -> Toolkit:
        return get_toolkit(self.settings)

    @cached_property
    def rules(self) -> RuleSet | None:
        path = self.settings.rules
        return None if path is None else load_rules(path)

    @cached_property
    def run_config(self) -> dict[str, Any]:
        return run_config(self.settings)

    def session(self) -> AbstractContextManager[Session]:
        return session_scope(self.settings.database_url)

    def drop_models(self) -> None:
        """Let the models go once the pages are read; a later page would load them again."""
        self.__dict__.pop("toolkit", None)
        drop_toolkits()

    @property
    def run_id(self) -> str:
        """The run this process's documents go under: `OCRFLEET_RUN_ID` when pinned (it
        must be registered; nothing is computed, so a process without the engines' files
        can ingest), else this process's own run."""
        if self._run_id is None:
            pinned = self.settings.run_id
            if pinned is None:
                self._run_id = self.own_run_id
            else:
                with self.session() as session:
                    registered(session, pinned)
                self._run_id = pinned
        return self._run_id

    @cached_property
    def own_run_id(self) -> str:
        """The run this process's settings and model files make, registered with its
        configuration: what a process that reads pages works under. PinMismatch when
        `OCRFLEET_RUN_ID` names another run (a worker refuses to start)."""
        run_id = run_id_of(self.run_config)
        check_pin(self.settings, run_id)
        with self.session() as session:
            ensure_run(session, self.run_config)
        return run_id


@dataclass(frozen=True)
class IngestOutcome:
    document_id: int
    status: ir.DocumentStatus
    page_ids: list[int]  # pages still to process: enqueue these after the commit
    created: bool
    reason: str | None = None


def page_key(sha256: str, dpi: int, number: int) -> str:
    return f"derived/{sha256}/{dpi}dpi/p{number:04d}.png"


def ingest(
    ctx: Context,
    uri: str,
    *,
    data: bytes | None = None,
    priority: str = "normal",
    metadata: dict[str, Any] | None = None,
    on_split: Callable[[int], None] | None = None,
) -> IngestOutcome:
    """Fetch, hash, dedup, validate and split one input; rejected input is a terminal row.
    `on_split(page count)` is called when an input new to the run has been opened and
    passed the limits, before its pages are rendered."""
    run_id = ctx.run_id
    if data is None:
        data = read_uri(uri, ctx.settings)
    sha256 = hashlib.sha256(data).hexdigest()
    tenant = models.metadata_tenant(metadata)
    with ctx.session() as session:
        existing = _find_document(session, sha256, run_id, tenant)
        if existing is not None and existing.status != ir.DocumentStatus.pending:
            return _outcome(session, existing, created=False)

    common = {
        "run_id": run_id,
        "sha256": sha256,
        "tenant": tenant,
        "source_uri": storable_uri(uri),
        "byte_size": len(data),
        "priority": priority,
        "meta": metadata,
    }
    try:
        with split_document(data, ctx.settings, uri) as split:
            document = split.document
            if on_split is not None:
                on_split(document.page_count)
            pages = _store_pages(ctx, split)
    except InputRejected as rejected:
        return _finish_input(ctx, common, ir.DocumentStatus.rejected, str(rejected))
    except Exception as exc:
        if is_transient(exc):
            raise  # the task retries it; nothing was recorded
        # A fault of ours or of a library on this input: this document fails, the run goes on.
        log.exception("ingest of %s failed", display_uri(uri))
        return _finish_input(ctx, common, ir.DocumentStatus.failed, describe(exc))

    split_values = {"media_type": document.media_type, "page_count": document.page_count}
    processing = ir.DocumentStatus.processing
    with ctx.session() as session:
        doc_id = upsert(
            session,
            models.Document,
            {**common, **split_values, "status": processing},
            key=models.DOCUMENT_KEY,
            update=[],
        )
        # A submitted (`pending`) row moves on to `processing`; one that moved elsewhere
        # while this ingest split it (cancelled) stays as it is, and gets no pages.
        doc = models.Document
        states.move(session, doc, processing, doc.id == doc_id, **split_values)
        row = session.get(doc, doc_id)
        if row.status == processing:
            for page in pages:
                upsert(
                    session,
                    models.Page,
                    {
                        "document_id": doc_id,
                        "number": page.number,
                        "width": page.width,
                        "height": page.height,
                        "image_uri": page.image_uri,
                    },
                    key=["document_id", "number"],
                    update=[],
                )
            session.flush()
        outcome = _outcome(session, row, created=row.status == processing)
    if not outcome.created:  # the images written for it may be nobody's
        discard_unreferenced(ctx, [page.image_uri for page in pages if page.image_uri])
    return outcome


def _finish_input(
    ctx: Context, common: dict[str, Any], status: ir.DocumentStatus, reason: str
) -> IngestOutcome:
    """The terminal row of an input that produced no pages (rejected or failed); a row
    that moved on meanwhile (cancelled) keeps its state."""
    with ctx.session() as session:
        doc_id = upsert(
            session,
            models.Document,
            {**common, "status": status, "reason": reason},
            key=models.DOCUMENT_KEY,
            update=[],
        )
        states.move(session, models.Document, status, models.Document.id == doc_id, reason=reason)
        return _outcome(session, session.get(models.Document, doc_id), created=True)


def record_unreadable(ctx: Context, uri: str, error: StorageError) -> IngestOutcome:
    """A `rejected` row for an input that could not be read at all (vanished between
    listing and reading, no permission). There are no bytes to hash, so the row is keyed on
    the sha256 of the URI; reading the same path again later makes a new document."""
    codes = {"ObjectNotFound": "not_found", "AccessDenied": "access_denied"}
    reason = codes.get(type(error).__name__, "unreadable")
    common = {
        "run_id": ctx.run_id,
        "sha256": hashlib.sha256(uri.encode("utf-8", "surrogateescape")).hexdigest(),
        "tenant": models.metadata_tenant(None),
        "source_uri": uri,
        "byte_size": None,
        "priority": "normal",
        "meta": None,
    }
    detail = f"{reason}: {display_uri(uri)} could not be read ({describe(error)})"
    return _finish_input(ctx, common, ir.DocumentStatus.rejected, detail)


def _store_pages(ctx: Context, split: Split) -> list[ir.Page]:
    """Render page by page into the store, so a long PDF never sits in memory whole; the
    rendering runs under the split's budget (`ocrfleet.pipeline.sandbox`).

    An input can still turn out bad half-way (a TIFF whose third frame is cut short, a page
    over the budget): then the images already written are removed again, unless a page row
    of another run uses them (page keys are shared by every run with the same input and
    DPI)."""
    pages: list[ir.Page] = []
    try:
        for page in split.pages():
            key = page_key(split.document.sha256, ctx.settings.dpi, page.number)
            uri = ctx.store.put(key, page.png, content_type="image/png")
            pages.append(
                ir.Page(number=page.number, width=page.width, height=page.height, image_uri=uri)
            )
        if not pages:
            raise InputRejected("no_pages", "the input has no pages")
    except BaseException:
        discard_unreferenced(ctx, [page.image_uri for page in pages if page.image_uri])
        raise
    return pages


def discard_unreferenced(ctx: Context, uris: list[str]) -> list[str]:
    """Delete those of `uris` (page images in the store) that no page row references;
    returns the URIs deleted."""
    if not uris:
        return []
    with ctx.session() as session:
        used = set(
            session.scalars(select(models.Page.image_uri).where(models.Page.image_uri.in_(uris)))
        )
    deleted = []
    for uri in uris:
        if uri not in used:
            ctx.store.delete(ctx.store.key_of(uri))
            deleted.append(uri)
    return deleted


def _find_document(
    session: Session, sha256: str, run_id: str, tenant: str
) -> models.Document | None:
    doc = models.Document
    return session.scalars(
        select(doc).where(doc.sha256 == sha256, doc.run_id == run_id, doc.tenant == tenant)
    ).one_or_none()


def _outcome(session: Session, doc: models.Document, *, created: bool) -> IngestOutcome:
    pending = session.scalars(
        select(models.Page.id)
        .where(models.Page.document_id == doc.id, models.Page.status == ir.PageStatus.pending)
        .order_by(models.Page.number)
    ).all()
    return IngestOutcome(
        document_id=doc.id,
        status=ir.DocumentStatus(doc.status),
        page_ids=list(pending),
        created=created,
        reason=doc.reason,
    )


def process_page(ctx: Context, page_id: int) -> ir.PageStatus:
    """OCR one page and commit all of it at once; a finished page is a no-op. A page of
    another run than this process's raises OtherRun before any work: it is left for a
    worker of that run."""
    from ocrfleet.pipeline.page import process_png

    with ctx.session() as session:
        page = session.get(models.Page, page_id)
        if page is None:
            raise LookupError(f"page {page_id} does not exist")
        if page.status != ir.PageStatus.pending:
            return ir.PageStatus(page.status)
        number, image_uri, document_id = page.number, page.image_uri, page.document_id
    check_page_run(ctx, page_id)

    data = ctx.store.get(ctx.store.key_of(image_uri))
    processed = process_png(number, data, ctx.toolkit)
    result = processed.result
    upright = store_upright(ctx, image_uri, data, processed)

    with ctx.session() as session:
        clear_waiting(session, document_id)
        save_page_result(session, page_id, result)
        if ctx.rules is not None:
            flag_page(session, page_id, result, ctx.rules)
        finished = _finish_page(
            session,
            page_id,
            ir.PageStatus.done,
            input_sha256=hashlib.sha256(data).hexdigest(),
            output_sha256=output_sha256(result),
            params=page_params(ctx, processed),
            **upright,
        )
        if finished is not None and ctx.rules is not None:
            flag_document(session, finished, ctx.rules)
    if upright:  # the page as split, unless another run's page row shares it
        discard_unreferenced(ctx, [image_uri])
    del data, processed, result  # persisted: the page's images go now, not with the next
    ctx.toolkit.release_memory()
    return ir.PageStatus.done


def store_upright(
    ctx: Context, image_uri: str, data: bytes, processed: ProcessedPage
) -> dict[str, Any]:
    """A page the orientation check turned is stored upright, beside the page as split
    (its text layer turned with it): its regions are in the upright image's pixels, and
    every output draws them on the page row's image (the searchable PDF and its text layer,
    hOCR, ALTO, the review crops). The page row's new image and size, or {} for a page
    read as it was."""
    from ocrfleet.pipeline import textlayer

    if not processed.orientation.applied:
        return {}
    image, angle = processed.image, processed.orientation.angle
    layer = textlayer.read_png(data)
    if layer is not None:
        size = (image.height, image.width) if angle in (90, 270) else image.size
        layer = textlayer.turned(layer, angle, size)
    key = ctx.store.key_of(image_uri).removesuffix(".png") + f".upright{angle}.png"
    png = textlayer.page_png(image, layer)
    uri = ctx.store.put(key, png, content_type="image/png")
    return {"image_uri": uri, "width": image.width, "height": image.height}


def output_sha256(result: ir.PageResult) -> str:
    """The hash of a page's output: the canonical JSON of its regions and texts (and their
    scores and decisions), what `ocrfleet repro` compares across runs."""
    output = result.model_dump(mode="json", exclude={"reviews"})  # the engines' output only
    return hashlib.sha256(canonical_json(output).encode()).hexdigest()


def page_params(ctx: Context, processed: ProcessedPage) -> dict[str, Any]:
    """The effective parameters of this page's processing, recorded beside its output: the
    run, the size it was read at (upright), the turn that made it upright and how its lines
    were detected (not for a page read from its text layer)."""
    image = processed.image
    detection = processed.detection
    return {
        "run_id": ctx.own_run_id,
        "width": image.width,
        "height": image.height,
        "orientation": processed.orientation.model_dump(mode="json"),
        **({"detection": detection.model_dump(mode="json")} if detection else {}),
        **text_layer_params(processed),
    }


def text_layer_params(processed: ProcessedPage) -> dict[str, Any]:
    """A PDF page's text layer, when judged: used or not, why, and the evidence."""
    judged = processed.text_layer
    if judged is None:
        return {}
    return {
        "text_layer": {
            "used": judged.good,
            "why": judged.why,
            "unmapped": round(judged.unmapped, 4),
            "ink_coverage": round(judged.coverage, 4),
        }
    }


def check_page_run(ctx: Context, page_id: int) -> None:
    """OtherRun if the page's document is of another run than this process's: asked before
    a delivery is counted, so a page that waits for its run's worker is never poison."""
    doc, page = models.Document, models.Page
    with ctx.session() as session:
        found = session.execute(
            select(doc.id, doc.run_id)
            .join(page, page.document_id == doc.id)
            .where(page.id == page_id)
        ).one_or_none()
    if found is not None and found.run_id != ctx.own_run_id:
        raise OtherRun(found.run_id, ctx.own_run_id, found.id)


WAITING = "waiting for a worker of run "


def wait_for_run(ctx: Context, document_id: int, run_id: str) -> None:
    """Say on an unfinished document why it does not move: its work waits for a worker of
    its run (`ocrfleet status` shows the reason). The first page of it that a worker of
    that run finishes clears it (`clear_waiting`)."""
    doc = models.Document
    unfinished = [status.value for status in states.UNFINISHED]
    with ctx.session() as session:
        session.execute(
            update(doc)
            .where(doc.id == document_id, doc.status.in_(unfinished))
            .where(doc.reason.is_(None) | doc.reason.startswith(WAITING))
            .values(reason=f"{WAITING}{run_id[:12]}…")
        )


def clear_waiting(session: Session, document_id: int) -> None:
    """Drop the `wait_for_run` reason: a worker of the document's run has its work."""
    doc = models.Document
    waiting = doc.reason.startswith(WAITING)
    session.execute(update(doc).where(doc.id == document_id, waiting).values(reason=None))


def run_page(ctx: Context, page_id: int) -> ir.PageStatus:
    """`process_page` for the embedded run: any exception fails this page alone, with the
    exception's first line as the reason (the traceback goes to the log once)."""
    try:
        return process_page(ctx, page_id)
    except Exception as exc:
        log.exception("page %s failed", page_id)
        fail_page(ctx, page_id, describe(exc))
        return ir.PageStatus.failed


def fail_page(ctx: Context, page_id: int, reason: str) -> None:
    """Terminal failure of one page; its document finishes as `partial`."""
    with ctx.session() as session:
        finished = _finish_page(session, page_id, ir.PageStatus.failed, reason=reason)
        if finished is not None and ctx.rules is not None:
            flag_document(session, finished, ctx.rules)


def _finish_page(
    session: Session, page_id: int, status: ir.PageStatus, **values: Any
) -> int | None:
    """Mark a page finished and count it on its document, atomically; returns the
    document's id when this page was its last (for the document rules), else None.

    The guarded move makes a redelivered page count once, and `states.count_page` lets the
    last page to finish, whichever worker ran it, finish the document."""
    page = models.Page
    moved = states.move(
        session, page, status, page.id == page_id, returning=page.document_id, **values
    )
    if not moved:
        return None
    doc_id = moved[0]
    finished = states.count_page(session, doc_id, status)
    return doc_id if finished in (ir.DocumentStatus.done, ir.DocumentStatus.partial) else None


def record_delivery(ctx: Context, page_id: int) -> int:
    """Count one delivery of a page's task before any work on it; returns the new count.

    The count lives in the database, not the broker, so it survives worker crashes and
    broker restarts: a page whose task keeps killing its worker is found by this number
    and failed, instead of being redelivered forever."""
    with ctx.session() as session:
        deliveries = session.scalar(
            update(models.Page)
            .where(models.Page.id == page_id)
            .values(deliveries=models.Page.deliveries + 1)
            .returning(models.Page.deliveries)
        )
    if deliveries is None:
        raise LookupError(f"page {page_id} does not exist")
    return int(deliveries)


def fail_document(ctx: Context, document_id: int, reason: str) -> bool:
    """Terminal failure of a document that never got its pages (its input could not be
    fetched, or it was submitted under another run); returns whether it changed. Only a
    `pending` document moves, so a redelivered failure changes nothing."""
    with ctx.session() as session:
        doc = models.Document
        moved = states.move(
            session, doc, ir.DocumentStatus.failed, doc.id == document_id, reason=reason
        )
    return bool(moved)


def page_cancelled(ctx: Context, page_id: int) -> bool:
    """Whether the page was cancelled with its document: its queued task is skipped."""
    with ctx.session() as session:
        status = session.scalar(select(models.Page.status).where(models.Page.id == page_id))
    return status == ir.PageStatus.cancelled
