"""The one Celery app. Everything it knows comes from `Settings`.

Delivery is at-least-once: a message is acknowledged after its task finished
(`acks_late`), a worker reserves one message at a time (`prefetch_multiplier=1`), and a
message whose worker process died goes back to the queue (`reject_on_worker_lost`). The
database counts deliveries per page, so a page that kills its worker every time ends
`failed` instead of looping (see `tasks.process_page`).

Workers run the prefork pool with one child per device (see `ocrfleet.tasks.launcher`): the
parent never loads a model or touches CUDA, the child loads the models in
`worker_process_init`, the parent enforces the hard time limit (the solo pool cannot) and
notices at once when the child dies, so a killed page is requeued immediately, at the head
of its queue (`ocrfleet.tasks.broker`, which `ocrfleet.tasks.worker` sets), rather than
after the broker's visibility timeout, and the child is recycled by task count or memory.

This module is the app alone, for producers (submit, the API, the sweeps) as much as for
workers: it imports nothing of the worker runtime. Workers start from
`ocrfleet.tasks.worker`, which connects the lifecycle handlers to this app.
"""

from __future__ import annotations

import time
from typing import Any

from celery import Celery
from celery.signals import before_task_publish

from ocrfleet.config import Settings, get_settings
from ocrfleet.tasks import routing

# The pool waits this long for a new child to report up; the child loads the models first.
MODEL_LOAD_TIMEOUT_S = 900.0

# Stamped on every message at publish, so the worker can measure its queue wait.
SENT_AT_HEADER = "ocrfleet_sent_at"


class ConfigurationError(ValueError):
    """Settings that would break delivery guarantees."""


def celery_config(settings: Settings) -> dict[str, Any]:
    if settings.visibility_timeout <= settings.task_time_limit:
        raise ConfigurationError(
            f"visibility_timeout ({settings.visibility_timeout}s) must exceed task_time_limit "
            f"({settings.task_time_limit}s), or Redis hands a running page to a second worker"
        )
    if settings.task_soft_time_limit >= settings.task_time_limit:
        raise ConfigurationError(
            f"task_soft_time_limit ({settings.task_soft_time_limit}s) must be below "
            f"task_time_limit ({settings.task_time_limit}s)"
        )
    return {
        "broker_url": settings.broker_url,
        "result_backend": settings.result_backend,
        "task_ignore_result": True,  # the database is the record, not the result backend
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,  # a worker outlives any broker restart
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout,
            "queue_order_strategy": "priority",  # consume queues in the order listed
            # Sweep for messages of dead workers every tenth of the visibility timeout
            # (kombu's default is ~100 s between real scans).
            "unacked_restore_interval": min(60, max(5, settings.visibility_timeout // 10)),
            "unacked_restore_throttle": 1,
            "socket_timeout": 30,  # a publish never hangs on a broker that vanished
            "socket_connect_timeout": 5,
            "socket_keepalive": True,
            "retry_on_timeout": True,
            "health_check_interval": 10,
        },
        "task_publish_retry": True,
        "task_publish_retry_policy": {
            "max_retries": 20,
            "interval_start": 0.2,
            "interval_step": 0.5,
            "interval_max": 3.0,
        },
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_queues": routing.task_queues(),
        "task_routes": routing.TASK_ROUTES,
        "task_default_queue": "ingest",
        "task_create_missing_queues": False,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # A failed task was already recorded (page failed with its reason): ack it. A hard
        # time limit kills the child mid-page: requeue it, the delivery cap ends loops.
        "task_acks_on_failure": True,
        "task_acks_on_timeout": False,
        "task_soft_time_limit": settings.task_soft_time_limit,
        "task_time_limit": settings.task_time_limit,
        "task_send_sent_event": True,  # enqueue -> start latency in Flower and bench
        "worker_prefetch_multiplier": 1,
        "worker_max_tasks_per_child": settings.worker_max_tasks,
        "worker_max_memory_per_child": settings.worker_max_memory_mb * 1024,  # KiB
        "worker_proc_alive_timeout": MODEL_LOAD_TIMEOUT_S,
        # A running page keeps running through a broker outage; its ack may be lost, and
        # then the visibility timeout redelivers it, which is a no-op for a finished page.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "worker_hijack_root_logger": True,
        "worker_log_format": (
            "[%(asctime)s: %(levelname)s/%(processName)s] %(name)s: %(message)s%(log_context)s"
        ),
        "worker_task_log_format": (
            "[%(asctime)s: %(levelname)s/%(processName)s] %(name)s: %(message)s%(log_context)s"
        ),
    }


_apps: dict[str, Celery] = {}


def create_app(settings: Settings) -> Celery:
    """The app for `settings`, one per distinct settings in a process.

    Task modules are imported only by workers (`include`), so a producer that sends tasks by
    name never imports the pipeline."""
    key = settings.model_dump_json()
    app = _apps.get(key)
    if app is None:
        app = Celery(
            "ocrfleet",
            include=[
                "ocrfleet.tasks.tasks",
                "ocrfleet.tasks.webhooks",
            ],
            task_cls="ocrfleet.tasks.base:FleetTask",
            set_as_current=False,
        )
        app.conf.update(celery_config(settings))
        app = _apps.setdefault(key, app)
    return app


def _stamp_sent_at(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if headers is not None:
        headers.setdefault(SENT_AT_HEADER, time.time())


before_task_publish.connect(_stamp_sent_at, weak=False, dispatch_uid="ocrfleet.sent_at")

app = create_app(get_settings())
