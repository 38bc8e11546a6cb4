"""The fleet's two tasks: thin wrappers over `ocrfleet.service`, which does the work.

What the wrappers add is delivery policy: count each page delivery in the database and
fail a poison page; retry transient errors (S3 throttling/5xx, lost database or Redis
connections) with exponential backoff and full jitter; fail at once, with the reason on
the row, on anything else; put work of another run back for a worker of that run; and
enqueue page tasks only after the commit that made the rows, with ids, never bytes, in the
messages.
"""

from __future__ import annotations

import logging
from typing import Any

from ocrfleet import service
from ocrfleet.runs import OtherRun
from ocrfleet.tasks import routing
from ocrfleet.tasks.app import app
from ocrfleet.tasks.base import FleetTask
from ocrfleet.tasks.lifecycle import context, page_started

log = logging.getLogger(__name__)

# Work of another run goes back to its queue, due this many seconds later: a worker of that
# run takes it meanwhile, and a fleet with none of them does not spin on it.
RUN_WAIT_S = 10


@app.task(name=routing.INGEST_TASK, bind=True, log_fields=("uri", "document_id"))
def ingest(
    self: FleetTask,
    uri: str,
    *,
    priority: str = "normal",
    metadata: dict[str, Any] | None = None,
    document_id: int | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Fetch, hash, dedup, validate and split one input, then enqueue its pages.

    `document_id` and `run_id` come from `client.submit`, which made the `pending` row:
    the document is failed with a reason if its input cannot be read; if this worker's
    configuration is another run than the submitter's, the message is left for a worker of
    the submitter's run."""
    ctx = context()

    def give_up(reason: str) -> dict[str, Any]:
        log.error("ingest of %s failed: %s", uri, reason)
        if document_id is not None:
            service.fail_document(ctx, document_id, reason)
        return {"document_id": document_id, "status": "failed", "reason": reason}

    def work() -> dict[str, Any]:
        routing.check_priority(priority)
        if run_id is not None and run_id != ctx.run_id:
            leave_for_run(self, OtherRun(run_id, ctx.run_id, document_id))
            return {"document_id": document_id, "status": "left", "run_id": run_id}
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

    return self.guard(work, give_up)


def leave_for_run(task: FleetTask, other: OtherRun) -> None:
    """Put this message back on its queue, due RUN_WAIT_S from now, for a worker of its run;
    say so on the document (`ocrfleet status`), in metrics and in Redis (the scheduler
    reports runs whose work waits for a worker nobody runs). A publish that fails is a
    transient error the task's guard retries: the message is never dropped."""
    from ocrfleet.tasks import heartbeat, monitoring

    log.warning("%s: left for a worker of that run", other)
    if other.document_id is not None:
        service.wait_for_run(context(), other.document_id, other.run_id)
    monitoring.count_left(other.run_id, "page" if task.name == routing.PAGE_TASK else "ingest")
    try:
        heartbeat.note_waiting(other.run_id, other.own)
    except Exception as exc:  # the scheduler's hint only: never in the way of the message
        log.warning("cannot note the waiting run in Redis: %s", exc)
    queue = task.request.delivery_info.get("routing_key")
    task.apply_async(task.request.args, task.request.kwargs, queue=queue, countdown=RUN_WAIT_S)


def enqueue_pages(page_ids: list[int], priority: str) -> None:
    """One message per page, on the page queue of `priority`, after the commit."""
    queue = routing.page_queue(priority)
    with app.producer_or_acquire() as producer:
        for page_id in page_ids:
            process_page.apply_async((page_id,), queue=queue, producer=producer)


@app.task(name=routing.PAGE_TASK, bind=True, log_fields=("page_id",))
def process_page(self: FleetTask, page_id: int) -> str:
    """regions -> candidates -> scores -> decisions for one page, in one transaction; the
    last page of a document marks the document finished (atomically, in the service)."""
    ctx = context()
    max_deliveries = ctx.settings.max_deliveries

    def give_up(reason: str) -> str:
        log.error("page %s failed: %s", page_id, reason)
        service.fail_page(ctx, page_id, reason)
        return "failed"

    def work() -> str:
        if service.page_cancelled(ctx, page_id):  # cancelled while queued: skip it
            log.info("page %s skipped: its document was cancelled", page_id)
            return "cancelled"
        try:
            service.check_page_run(ctx, page_id)  # before counting: waiting is no delivery
        except OtherRun as other:
            leave_for_run(self, other)
            return "left"
        deliveries = service.record_delivery(ctx, page_id)
        # Our own retries are new deliveries too; what is left are crashes (worker
        # killed, hard time limit) and duplicate messages.
        if deliveries - self.request.retries > max_deliveries:
            return give_up(
                f"poison: delivered {deliveries} times, exceeds max_deliveries={max_deliveries}"
            )
        page_started.send(sender=self, page_id=page_id, delivery=deliveries)
        return service.process_page(ctx, page_id).value

    return self.guard(work, give_up)
