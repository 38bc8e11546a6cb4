"""The fleet's two tasks: thin wrappers over `ocrfleet.service`, which does the work.

What the wrappers add is delivery policy: count each page delivery in the database and
fail a poison page; retry transient errors (S3 throttling/5xx, lost database or Redis
connections) with exponential backoff and full jitter; fail at once, with the reason on
the row, on anything else; and enqueue page tasks only after the commit that made the
rows, with ids, never bytes, in the messages.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from celery import Task
from celery.exceptions import Reject, Retry, SoftTimeLimitExceeded
from celery.utils.time import get_exponential_backoff_interval

from ocrfleet import service
from ocrfleet.config import get_settings
from ocrfleet.errors import caused_by, describe, is_transient
from ocrfleet.tasks import routing
from ocrfleet.tasks.app import app
from ocrfleet.tasks.signals import bind_log_context, page_started

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_TRANSIENT_RETRIES = 12
BACKOFF_BASE_S = 1
BACKOFF_MAX_S = 60
REQUEUE_PAUSE_S = 5

_context: service.Context | None = None


def context() -> service.Context:
    """This process's context (settings from the environment; store, models and run id load
    lazily, after the pool forked)."""
    global _context
    if _context is None:
        _context = service.Context(get_settings())
    return _context


def backoff(retries: int) -> int:
    return get_exponential_backoff_interval(
        factor=BACKOFF_BASE_S, retries=retries, maximum=BACKOFF_MAX_S, full_jitter=True
    )


def _guard(task: Task, work: Callable[[], T], give_up: Callable[[str], T]) -> T:
    """Run `work`; retry it later on a transient error, call `give_up(reason)` otherwise.

    A transient error that outlasts MAX_TRANSIENT_RETRIES gives up too. If even the retry
    cannot be published (broker down), the message is rejected back to the queue, or, with
    the broker unreachable, stays unacknowledged until the visibility timeout: never lost."""
    limit = app.conf.task_soft_time_limit
    try:
        return work()
    except SoftTimeLimitExceeded:
        return _give_up(give_up, f"timeout: over the soft time limit of {limit}s")
    except Exception as exc:
        if caused_by(exc, SoftTimeLimitExceeded):  # e.g. wrapped by rapidocr's session
            return _give_up(give_up, f"timeout: over the soft time limit of {limit}s")
        retries = task.request.retries
        if not is_transient(exc):
            log.warning("permanent error, not retrying: %s", describe(exc), exc_info=True)
            return _give_up(give_up, describe(exc))
        if retries >= MAX_TRANSIENT_RETRIES:
            reason = f"transient error persisted after {retries} retries: {describe(exc)}"
            return _give_up(give_up, reason)
        countdown = backoff(retries)
        log.warning("transient error, retry %d in %ss: %s", retries + 1, countdown, describe(exc))
        try:
            raise task.retry(exc=exc, countdown=countdown, max_retries=MAX_TRANSIENT_RETRIES)
        except Retry:
            raise
        except Exception as publish_error:
            raise Reject(describe(publish_error), requeue=True) from publish_error


def _give_up(give_up: Callable[[str], T], reason: str) -> T:
    """Record the failure; if even that fails for a transient reason (database down), put
    the message back after a pause rather than acknowledge a failure nobody recorded."""
    try:
        return give_up(reason)
    except Exception as exc:
        if not is_transient(exc):
            raise
        log.error("cannot record the failure (%s); requeueing the message", describe(exc))
        time.sleep(REQUEUE_PAUSE_S)
        raise Reject(describe(exc), requeue=True) from exc


@app.task(name=routing.INGEST_TASK, bind=True)
def ingest(
    self: Task,
    uri: str,
    *,
    priority: str = "normal",
    metadata: dict[str, Any] | None = None,
    document_id: int | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Fetch, hash, dedup, validate and split one input, then enqueue its pages.

    `document_id` and `run_id` come from `client.submit`, which made the `pending` row:
    the document is failed with a reason if its input cannot be read, or if this worker's
    configuration is another run than the submitter's."""
    ctx = context()
    with bind_log_context(uri=uri, document_id=document_id):

        def give_up(reason: str) -> dict[str, Any]:
            log.error("ingest of %s failed: %s", uri, reason)
            if document_id is not None:
                service.fail_document(ctx, document_id, reason)
            return {"document_id": document_id, "status": "failed", "reason": reason}

        def work() -> dict[str, Any]:
            routing.check_priority(priority)
            if run_id is not None and run_id != ctx.run_id:
                return give_up(
                    f"run mismatch: submitted for run {run_id}, this worker runs {ctx.run_id}; "
                    "submitters and workers must share the settings that make run_id"
                )
            outcome = service.ingest(ctx, uri, priority=priority, metadata=metadata)
            if document_id is not None and outcome.document_id != document_id:
                log.warning("submitted as document %s, ingested as %s", document_id, outcome)
            redelivered = bool(self.request.delivery_info.get("redelivered"))
            # A new document enqueues its pages. An existing one only does when this message
            # may have died between the commit and the enqueue (redelivered or retried).
            if outcome.created or redelivered or self.request.retries > 0:
                enqueue_pages(outcome.page_ids, priority)
            log.info(
                "document %s %s: %d page(s) enqueued",
                outcome.document_id,
                outcome.status.value,
                len(outcome.page_ids),
            )
            return {
                "document_id": outcome.document_id,
                "status": outcome.status.value,
                "pages": len(outcome.page_ids),
                "reason": outcome.reason,
            }

        return _guard(self, work, give_up)


def enqueue_pages(page_ids: list[int], priority: str) -> None:
    """One message per page, on the page queue of `priority`, after the commit."""
    queue = routing.page_queue(priority)
    with app.producer_or_acquire() as producer:
        for page_id in page_ids:
            process_page.apply_async((page_id,), queue=queue, producer=producer)


@app.task(name=routing.PAGE_TASK, bind=True)
def process_page(self: Task, page_id: int) -> str:
    """regions -> candidates -> scores -> decisions for one page, in one transaction; the
    last page of a document marks the document finished (atomically, in the service)."""
    ctx = context()
    max_deliveries = ctx.settings.max_deliveries
    with bind_log_context(page_id=page_id):

        def give_up(reason: str) -> str:
            log.error("page %s failed: %s", page_id, reason)
            service.fail_page(ctx, page_id, reason)
            return "failed"

        def work() -> str:
            if service.page_cancelled(ctx, page_id):  # cancelled while queued: skip it
                log.info("page %s skipped: its document was cancelled", page_id)
                return "cancelled"
            deliveries = service.record_delivery(ctx, page_id)
            # Our own retries are new deliveries too; what is left are crashes (worker
            # killed, hard time limit) and duplicate messages.
            if deliveries - self.request.retries > max_deliveries:
                return give_up(
                    f"poison: delivered {deliveries} times, exceeds max_deliveries={max_deliveries}"
                )
            page_started.send(sender=self, page_id=page_id, delivery=deliveries)
            return service.process_page(ctx, page_id).value

        return _guard(self, work, give_up)
