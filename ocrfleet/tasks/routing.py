"""Queue names and which queue a message goes to.

Priority is two queues per role, not message priorities: a worker consumes its queues in
the order listed (the Redis transport's `priority` order strategy puts every listed
queue into one BRPOP, first key first), so `gpu.high` always empties before `gpu`, and an
interactive upload never waits behind a bulk backfill.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from kombu import Queue

Priority = Literal["high", "normal"]
PRIORITIES: tuple[str, ...] = ("high", "normal")

INGEST_TASK = "ocrfleet.ingest"
PAGE_TASK = "ocrfleet.process_page"
WEBHOOK_TASK = "ocrfleet.webhook"
# Webhook deliveries wait on tenants' receivers: a queue of their own, consumed by a worker
# that takes nothing else, so a slow receiver never holds up an upload or a page.
WEBHOOK_QUEUE = "webhooks"

# role -> (high queue, normal queue)
ROLES: dict[str, tuple[str, str]] = {
    "gpu": ("gpu.high", "gpu"),
    "ingest": ("ingest.high", "ingest"),
}


def check_priority(priority: str) -> Priority:
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {PRIORITIES}, not {priority!r}")
    return priority  # type: ignore[return-value]


def queue_for(role: str, priority: str) -> str:
    """The queue a message of `role` ("gpu" pages or "ingest") at `priority` goes to."""
    high, normal = ROLES[role]
    return high if check_priority(priority) == "high" else normal


def ingest_queue(priority: str) -> str:
    return queue_for("ingest", priority)


def page_queue(priority: str) -> str:
    return queue_for("gpu", priority)


def consume_order(roles: Iterable[str]) -> list[str]:
    """Queues for a worker serving `roles`, in consumption order: every high queue before
    every normal one, roles in the order given (`gpu,ingest` finishes pages first)."""
    roles = [role.strip() for role in roles if role.strip()]
    unknown = [role for role in roles if role not in ROLES]
    if unknown or not roles:
        raise ValueError(f"queues must be a non-empty list of {sorted(ROLES)}: {roles}")
    ordered = list(dict.fromkeys(roles))
    return [ROLES[role][0] for role in ordered] + [ROLES[role][1] for role in ordered]


def task_queues() -> list[Queue]:
    """Plain direct queues (exchange and routing key = the queue's name), as Celery
    declares them itself: a message sent before any worker exists still lands."""
    names = [name for pair in ROLES.values() for name in pair] + [WEBHOOK_QUEUE]
    return [Queue(name) for name in names]


TASK_ROUTES = {
    INGEST_TASK: {"queue": "ingest"},
    PAGE_TASK: {"queue": "gpu"},
    WEBHOOK_TASK: {"queue": WEBHOOK_QUEUE},
}
