"""The webhook delivery task, and the hook that enqueues it when a task left a document in
a terminal state. Kept beside `tasks.py`, not in it: delivery policy for pages and
documents does not change when webhooks do."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from celery.signals import task_postrun

from ocrfleet import webhooks
from ocrfleet.config import get_settings
from ocrfleet.tasks import routing
from ocrfleet.tasks.app import app

log = logging.getLogger(__name__)


@app.task(name=webhooks.WEBHOOK_TASK, bind=True, max_retries=None)
def deliver_webhook(self: Task, document_id: int, review_id: int | None = None) -> dict[str, Any]:
    """One attempt of the completion webhook (or, with `review_id`, of a `reviewed` event);
    the next is this task again after the backoff, until `final`. The attempt ends within
    OCRFLEET_WEBHOOK_TIMEOUT_S however slowly the receiver answers."""
    settings = get_settings()
    outcome = webhooks.deliver(settings, document_id, review_id)
    log.info(
        "webhook of document %s%s, attempt %s: %s",
        document_id,
        "" if review_id is None else f" (review {review_id})",
        outcome.attempt,
        outcome.status_code or outcome.error,
    )
    if not outcome.final:
        raise self.retry(countdown=webhooks.backoff_s(settings, outcome.attempt))
    return {"document_id": document_id, "attempt": outcome.attempt, "delivered": outcome.delivered}


@task_postrun.connect
def _notify_when_finished(
    task: Task | None = None,
    args: tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    retval: Any = None,
    **_: Any,
) -> None:
    """After a page or ingest task, enqueue the document's webhook if it is now due (the
    claim inside makes this a no-op for every task but the one that finished it)."""
    if task is None:
        return
    settings = get_settings()
    try:
        if task.name == routing.PAGE_TASK and args:
            webhooks.notify_page_finished(settings, int(args[0]))
        elif task.name == routing.INGEST_TASK:
            document_id = (retval or {}).get("document_id") if isinstance(retval, dict) else None
            document_id = document_id or (kwargs or {}).get("document_id")
            if document_id is not None:
                webhooks.notify_finished(settings, int(document_id))
    except Exception:  # the task's own outcome stands; the webhook is logged as missed
        log.exception("could not enqueue the webhook after %s", task.name)
