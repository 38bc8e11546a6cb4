"""The webhook delivery task (the hook that enqueues it when a task left a document in a
terminal state is `ocrfleet.tasks.lifecycle`'s). Kept beside `tasks.py`, not in it: delivery
policy for pages and documents does not change when webhooks do."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

from ocrfleet import webhooks
from ocrfleet.config import get_settings
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
