"""`FleetTask`: the one base class of the fleet's tasks, for their delivery policy.

Every task runs its body through `guard`: a transient error (S3 throttling/5xx, lost
database or Redis connections) is retried with exponential backoff and full jitter, anything
else, and a transient error that outlasts `max_transient_retries`, calls the task's
`give_up(reason)`, which records the failure on its row. Every log record made while a task
runs carries the task's name, id and the arguments named in its `log_fields`.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from celery import Task
from celery.exceptions import Reject, Retry, SoftTimeLimitExceeded
from celery.utils.time import get_exponential_backoff_interval

from ocrfleet.errors import caused_by, describe, is_transient
from ocrfleet.tasks.lifecycle import bind_log_context

log = logging.getLogger(__name__)

T = TypeVar("T")

BACKOFF_BASE_S = 1
BACKOFF_MAX_S = 60
REQUEUE_PAUSE_S = 5


def backoff(retries: int) -> int:
    return get_exponential_backoff_interval(
        factor=BACKOFF_BASE_S, retries=retries, maximum=BACKOFF_MAX_S, full_jitter=True
    )


class FleetTask(Task):
    """A task whose body runs through `guard`, with its arguments in the log context."""

    #: arguments of the task function bound into every log record while it runs
    log_fields: ClassVar[tuple[str, ...]] = ()
    max_transient_retries: ClassVar[int] = 12

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        context: dict[str, Any] = {"task": self.name, "task_id": self.request.id}
        if self.log_fields:
            bound = inspect.signature(self.run).bind_partial(*args, **kwargs).arguments
            context.update({name: bound.get(name) for name in self.log_fields})
        with bind_log_context(**context):
            return super().__call__(*args, **kwargs)

    def guard(self, work: Callable[[], T], give_up: Callable[[str], T]) -> T:
        """Run `work`; retry it later on a transient error, call `give_up(reason)` otherwise.

        If even the retry cannot be published (broker down), the message is rejected back to
        the queue, or, with the broker unreachable, stays unacknowledged until the
        visibility timeout: never lost."""
        limit = self.app.conf.task_soft_time_limit
        try:
            return work()
        except SoftTimeLimitExceeded:
            return self._give_up(give_up, f"timeout: over the soft time limit of {limit}s")
        except Exception as exc:
            if caused_by(exc, SoftTimeLimitExceeded):  # e.g. wrapped by rapidocr's session
                return self._give_up(give_up, f"timeout: over the soft time limit of {limit}s")
            retries = self.request.retries
            if not is_transient(exc):
                log.warning("permanent error, not retrying: %s", describe(exc), exc_info=True)
                return self._give_up(give_up, describe(exc))
            if retries >= self.max_transient_retries:
                reason = f"transient error persisted after {retries} retries: {describe(exc)}"
                return self._give_up(give_up, reason)
            countdown = backoff(retries)
            log.warning(
                "transient error, retry %d in %ss: %s", retries + 1, countdown, describe(exc)
            )
            try:
                raise self.retry(
                    exc=exc, countdown=countdown, max_retries=self.max_transient_retries
                )
            except Retry:
                raise
            except Exception as publish_error:
                raise Reject(describe(publish_error), requeue=True) from publish_error

    @staticmethod
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
