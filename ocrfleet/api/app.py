"""The FastAPI application. Every route but the probes and /metrics needs an API key
(`Authorization: Bearer <key>` or `X-API-Key`); a key sees only its tenant's documents
(`documents.tenant`, the column the review app filters on), and another tenant's document
is a 404, never a 403, so ids do not leak. The same file from two tenants is two documents.

Submissions go through `ocrfleet.client.submit`, the same code as every other producer:
an upload is spooled by the multipart parser, then hashed and streamed to the store."""

# No `from __future__ import annotations` here: FastAPI reads the routes' annotations, and
# `Tenant` is local to create_app, where a postponed name would not resolve.
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, File, Form, HTTPException, Path, Query, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from ocrfleet import client, ir, states
from ocrfleet.api import inputs
from ocrfleet.api.keys import KeyCache
from ocrfleet.api.limits import BodyLimit, RateLimiter
from ocrfleet.api.metrics import ApiMetrics, Measure
from ocrfleet.config import Settings, get_settings
from ocrfleet.db import models
from ocrfleet.db.session import session_scope
from ocrfleet.errors import public_reason
from ocrfleet.formats import FORMATS, render_document
from ocrfleet.storage import StorageError, open_store
from ocrfleet.storage.sources import SourceRefused, confine
from ocrfleet.webhooks import UnsafeCallbackURL, result_urls

PAGE_LIMIT = 100
DocumentId = Annotated[int, Path(ge=1, le=inputs.MAX_ID)]
log = logging.getLogger(__name__)
# One answer for a URI outside the tenant's sources and for a missing object in them, so
# the fleet's buckets cannot be probed through the API.
NO_SOURCE = (
    "`uri` names no object this API key may read: an existing object under its intake "
    "prefix or an allowed source"
)


def ping(database_url: str) -> None:
    with session_scope(database_url) as session:
        session.execute(text("SELECT 1"))


def tenants(doc: models.Document | None, document_id: int, tenant: str) -> models.Document:
    """`doc` if it is `tenant`'s, else 404 (missing and foreign documents look the same)."""
    if doc is None or doc.tenant != tenant:
        raise HTTPException(404, f"no document {document_id}")
    return doc


def _document_json(doc: models.Document, pages: list[models.Page] | None = None) -> dict:
    body: dict[str, Any] = {
        "id": doc.id,
        "status": doc.status,
        "reason": public_reason(doc.reason),
        "priority": doc.priority,
        "sha256": doc.sha256,
        "metadata": doc.meta,
        "callback_url": doc.callback_url,
        "pages": {
            "total": doc.page_count,
            "done": doc.pages_done,
            "failed": doc.pages_failed,
        },
        "created_at": doc.created_at.isoformat(),
        "updated_at": doc.updated_at.isoformat(),
    }
    if pages is not None:
        body["page_states"] = [
            {
                "number": page.number,
                "status": page.status,
                "reason": public_reason(page.reason),
            }
            for page in pages
        ]
    return body


def one_line(exc: RequestValidationError) -> str:
    """A validation error as one line: where (`query after`, `body metadata`) and what is
    wrong, never the input itself (it may be huge, or hostile)."""
    parts = []
    for error in exc.errors()[:3]:
        where = " ".join(str(part) for part in error.get("loc", ()))
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts).replace("\n", " ") or "invalid request"


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    keys = KeyCache()
    limiter = RateLimiter(settings.api_rate_per_s, settings.api_rate_burst)
    api_metrics = ApiMetrics(settings.database_url)

    @asynccontextmanager
    async def warm(_app: FastAPI) -> AsyncIterator[None]:
        # The run a submission goes under (client._run, cached per process) imports the
        # engines' modules, parses their configs and hashes their models: ~0.5 s of CPU.
        # Left to the first uploads, every threadpool thread that picks one up computes
        # it at once (the cache is filled after the fact), for seconds of a loaded CPU.
        # Likewise the engine and its first pooled connection (dialect imports, connect).
        # A warm-up that fails (the database is not up yet, a pinned run not registered
        # yet) only leaves the work to the first requests, which report it (503, /readyz).
        with suppress(Exception):
            await run_in_threadpool(client._run, settings)  # noqa: SLF001
            await run_in_threadpool(ping, settings.database_url)
        yield

    # /docs and /redoc load their scripts from the installed fastapi-offline package, not a
    # CDN: nothing is fetched from outside at run time, by us or by the reader's browser.
    app = FastAPIOffline(
        lifespan=warm,
        title="ocrfleet",
        version="1",
        description="Submit PDFs and images for OCR, follow them, fetch results, cancel.",
    )

    # Every malformed request is a 4xx with a one-line `detail`; anything else that escapes
    # a route is logged here and answered as a 500 without its text.
    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": one_line(exc)}, status_code=422)

    @app.exception_handler(inputs.BadInput)
    async def bad_input(_request: Request, exc: inputs.BadInput) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"detail": "internal error"}, status_code=500)

    app.add_middleware(Measure, metrics=api_metrics)
    app.add_middleware(BodyLimit, limit=settings.api_max_upload_bytes)

    # Each route opens its own short session: a session held by a yield dependency for the
    # whole request would pin a pooled connection while uploads stream, and its cleanup
    # needs a threadpool thread, so a busy API could deadlock waiting on its own pool.
    def db() -> Any:
        return session_scope(settings.database_url)

    async def tenant_of(request: Request) -> str:
        # async: a sync dependency costs every request a threadpool round trip of its own.
        header = request.headers.get("authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else None
        key = key or request.headers.get("x-api-key")
        tenant = await keys.lookup(settings.database_url, key) if key else None
        if tenant is None:
            raise HTTPException(
                401, "a valid API key is required", headers={"WWW-Authenticate": "Bearer"}
            )
        request.state.api_key_id = keys.key_id(key)  # its secret signs the callbacks
        wait = limiter.take(key)
        if wait > 0:
            raise HTTPException(
                429, "rate limit exceeded", headers={"Retry-After": str(max(1, round(wait)))}
            )
        return tenant

    Tenant = Annotated[str, Depends(tenant_of)]

    def owned(session: Session, document_id: int, tenant: str) -> models.Document:
        return tenants(session.get(models.Document, document_id), document_id, tenant)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/readyz", include_in_schema=False)
    def readyz() -> JSONResponse:
        """Which dependency is down, and nothing more: the probe answers anyone, and error
        texts name hosts, ports and users. The error goes to the API's log."""
        checks: dict[str, str] = {}
        try:
            ping(settings.database_url)
            checks["database"] = "ok"
        except Exception:  # noqa: BLE001 - the probe reports, it does not raise
            log.warning("readyz: the database is down", exc_info=True)
            checks["database"] = "down"
        try:
            from ocrfleet.tasks.app import create_app as celery_app

            with celery_app(settings).connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=2)
            checks["broker"] = "ok"
        except Exception:  # noqa: BLE001
            log.warning("readyz: the broker is down", exc_info=True)
            checks["broker"] = "down"
        ready = all(value == "ok" for value in checks.values())
        return JSONResponse(checks, status_code=200 if ready else 503)

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(api_metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/documents", status_code=202)
    def submit(
        request: Request,
        tenant: Tenant,
        file: Annotated[UploadFile | None, File(description="a PDF or image")] = None,
        uri: Annotated[str | None, Form(description="s3:// URI instead of a file")] = None,
        priority: Annotated[str, Form()] = "normal",
        metadata: Annotated[str | None, Form(description="a JSON object")] = None,
        callback_url: Annotated[str | None, Form()] = None,
    ) -> dict[str, Any]:
        """Submit one document; 202 with its id at once, processing goes on in the fleet."""
        for name, value in (("uri", uri), ("priority", priority), ("callback_url", callback_url)):
            inputs.text_field(name, value)
        if (file is None) == (uri is None):
            raise HTTPException(422, "send exactly one of `file` and `uri`")
        if uri is not None and not uri.startswith("s3://"):
            raise HTTPException(422, "`uri` must be an s3:// URI")
        if uri is not None:
            try:  # the tenant's own intake prefix or an allowed source, nothing else
                uri = confine(uri, tenant, settings)
            except SourceRefused:
                raise HTTPException(422, NO_SOURCE) from None
        meta = inputs.metadata(metadata)
        meta[models.TENANT_FIELD] = tenant  # becomes documents.tenant in client.submit
        if file is not None and file.filename:
            meta.setdefault("filename", inputs.text_field("filename", file.filename))
        try:
            document_id = client.submit(
                file.file if file is not None else uri,  # type: ignore[arg-type]
                priority=priority,
                metadata=meta,
                callback_url=callback_url,
                webhook_key_id=request.state.api_key_id,
                settings=settings,
            )
        except StorageError as exc:
            if uri is not None and exc.permanent:  # missing reads as refused: no probing
                raise HTTPException(422, NO_SOURCE) from None
            raise HTTPException(503, "the store is unavailable: try again later") from exc
        except (UnsafeCallbackURL, ValueError) as exc:
            raise HTTPException(422, str(exc)) from exc
        except client.SubmitError as exc:
            raise HTTPException(503, str(exc)) from exc
        with db() as session:
            doc = session.get(models.Document, document_id)
            assert doc is not None and doc.tenant == tenant
            return {**_document_json(doc), "links": _links(document_id)}

    def _links(document_id: int) -> dict[str, Any]:
        return {
            "self": f"/v1/documents/{document_id}",
            "results": result_urls(settings, document_id),
        }

    @app.get("/v1/documents/{document_id}")
    def status(document_id: DocumentId, tenant: Tenant) -> dict[str, Any]:
        """Status, page counts and each page's state."""
        # One round trip: the document and its pages in one outer join.
        with db() as session:
            rows = session.execute(
                select(models.Document, models.Page)
                .outerjoin(models.Page, models.Page.document_id == models.Document.id)
                .where(models.Document.id == document_id)
                .order_by(models.Page.number)
            ).all()
        doc = tenants(rows[0][0] if rows else None, document_id, tenant)
        pages = [page for _, page in rows if page is not None]
        return {**_document_json(doc, pages), "links": _links(document_id)}

    @app.get("/v1/documents/{document_id}/result")
    def result(
        document_id: DocumentId,
        tenant: Tenant,
        format: Annotated[str, Query(description=", ".join(FORMATS))] = "json",  # noqa: A002
    ) -> Response:
        """The result in one format, once the document is finished."""
        if format not in FORMATS:
            raise HTTPException(422, f"format must be one of {', '.join(FORMATS)}")
        with db() as session:
            doc = owned(session, document_id, tenant)
            if doc.status in states.UNFINISHED:
                raise HTTPException(409, f"document {document_id} is still {doc.status}")
            if not doc.page_count:  # rejected or failed before it was split
                raise HTTPException(
                    409, f"document {document_id} has no pages: {doc.status}: {doc.reason}"
                )
            store = open_store(settings) if format == "pdf" else None
            body = render_document(session, document_id, format, store)
        # nosniff: a browser takes text, Markdown and JSON for what they say they are.
        nosniff = {"X-Content-Type-Options": "nosniff"}
        return Response(body, media_type=FORMATS[format], headers=nosniff)

    @app.delete("/v1/documents/{document_id}", status_code=202)
    def cancel(document_id: DocumentId, tenant: Tenant) -> dict[str, Any]:
        """Cancel: queued pages are skipped, running pages finish, it ends `cancelled`."""
        with db() as session:
            doc = owned(session, document_id, tenant)
            if doc.status not in states.UNFINISHED:
                raise HTTPException(409, f"document {document_id} is already {doc.status}")
        state = client.cancel(document_id, settings=settings)
        return {"id": state.id, "status": state.status.value}

    @app.get("/v1/documents")
    def listing(
        tenant: Tenant,
        status: Annotated[ir.DocumentStatus | None, Query()] = None,
        since: Annotated[datetime | None, Query(description="created at or after")] = None,
        after: Annotated[
            int | None, Query(ge=0, le=inputs.MAX_ID, description="the `next` of the previous page")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=PAGE_LIMIT)] = 50,
    ) -> dict[str, Any]:
        """This tenant's documents, oldest first, `limit` at a time."""
        doc = models.Document
        query = select(doc).where(doc.tenant == tenant)
        if status is not None:
            query = query.where(doc.status == status)
        if since is not None:
            query = query.where(doc.created_at >= since)
        if after is not None:
            query = query.where(doc.id > after)
        with db() as session:
            rows = session.scalars(query.order_by(doc.id).limit(limit + 1)).all()
            more = len(rows) > limit
            rows = rows[:limit]
            return {
                "documents": [_document_json(row) for row in rows],
                "next": rows[-1].id if more else None,
            }

    return app
