"""Worker lifecycle: models loaded once per pool child, the log context, and the webhook
that follows a finished document.

`page_started` is ocrfleet's own signal, sent after a page's delivery was counted and before
any work on it: metrics exporters and tests connect to it. `ocrfleet.tasks.worker.connect`
connects these handlers, with the heartbeat's and the metrics', in the order they must run.
"""

from __future__ import annotations

import contextvars
import logging
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from celery.signals import celeryd_init, task_postrun, worker_process_init
from celery.utils.dispatch import Signal

from ocrfleet.config import get_settings
from ocrfleet.tasks import routing

if TYPE_CHECKING:
    from ocrfleet.service import Context

log = logging.getLogger(__name__)

#: sent with `page_id` and `delivery` (the count including this one), sender = the task.
page_started = Signal(name="page_started", providing_args={"page_id", "delivery"})

EX_CONFIG = 78  # sysexits: the worker cannot run with this configuration

_EMPTY: dict[str, Any] = {}
_log_context: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar(
    "ocrfleet_log_context",
    default=_EMPTY,  # never mutated: every bind sets a new dict
)
_state: dict[str, Any] = {
    "load_models": False,
    "ingest": False,
    "main_pid": None,
    "load_s": None,
    "run": None,
}
_context: Context | None = None


def context() -> Context:
    """This process's context (settings from the environment; store, models and run id load
    lazily, after the pool forked)."""
    global _context
    if _context is None:
        from ocrfleet.service import Context

        _context = Context(get_settings())
    return _context


def model_load_seconds() -> float | None:
    """How long this pool process took to load its models (None: it loads none)."""
    return _state["load_s"]


def worker_run_id() -> str | None:
    """The run this pool process reads pages of (None: it loads no models)."""
    return _state["run"]


@contextmanager
def bind_log_context(**values: Any) -> Iterator[None]:
    """Add `values` to every log record made inside the block (task id, page id, ...)."""
    token = _log_context.set({**_log_context.get(), **values})
    try:
        yield
    finally:
        _log_context.reset(token)


def log_context() -> dict[str, Any]:
    return dict(_log_context.get())


def _format_context(values: dict[str, Any]) -> str:
    if not values:
        return ""
    return " [" + " ".join(f"{key}={value}" for key, value in values.items()) + "]"


def install_log_record_factory() -> None:
    """Give every record a `log_context` attribute, which the worker log formats print."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "_ocrfleet", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        record.log_context = _format_context(_log_context.get())
        return record

    factory._ocrfleet = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def _queues_of(options: dict[str, Any]) -> list[str]:
    queues = options.get("queues") or []
    if isinstance(queues, str):
        queues = queues.split(",")
    return [str(queue).strip() for queue in queues]


def _on_celeryd_init(sender: Any = None, conf: Any = None, options: Any = None, **_: Any) -> None:
    """In the worker's main process, before logging is set up and before any fork."""
    install_log_record_factory()
    _state["main_pid"] = os.getpid()
    queues = _queues_of(options or {})
    _state["load_models"] = any(queue.startswith("gpu") for queue in queues)
    _state["ingest"] = any(queue.startswith("ingest") for queue in queues)


def _on_worker_process_init(**_: Any) -> None:
    """In each pool child, before it accepts a task: load the models here, never in the
    parent (CUDA does not survive a fork). A child that cannot load them stops the whole
    worker, so a bad model path is an error at start, not at the first page. An unpinned
    ingest child computes the run its documents go under from the engines' model files at
    start too: a host without them stops here instead of failing every document it splits
    (a pinned one computes nothing; its pin is checked when a document comes)."""
    if not _state["load_models"]:
        if _state["ingest"] and get_settings().run_id is None:
            try:
                log.info("documents go under run %s", context().run_id)
            except Exception:
                _stop_worker(
                    "cannot compute the run documents go under (pin it with "
                    "OCRFLEET_RUN_ID, see `ocrfleet run-id`, or install the engines' models)"
                )
        return
    started = time.monotonic()
    try:
        from ocrfleet.tasks.startup import startup_check  # imports the pipeline: children only

        ctx = context()
        startup_check(ctx.toolkit)  # loads the models, checks devices, one warm-up region
        _state["run"] = ctx.own_run_id  # registers the run; fails on a wrong pin
        log.info("worker runs %s", _state["run"])
    except Exception:
        _stop_worker("cannot load the models")
    _state["load_s"] = time.monotonic() - started


def _stop_worker(why: str) -> None:
    """Stop this pool child and its worker: a configuration it cannot run with."""
    log.critical("%s; stopping this worker", why, exc_info=True)
    main_pid = _state["main_pid"]
    if main_pid is not None and main_pid != os.getpid():  # a pool child: stop the worker
        os.kill(main_pid, signal.SIGTERM)
    os._exit(EX_CONFIG)
    log.info("models loaded in pool process %s in %.1fs", os.getpid(), _state["load_s"])


def _on_task_postrun(
    task: Any = None,
    args: tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    retval: Any = None,
    **_: Any,
) -> None:
    """After a page or ingest task, enqueue the document's webhook if it is now due (the
    claim inside makes this a no-op for every task but the one that finished it)."""
    if task is None:
        return
    from ocrfleet import webhooks

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


def connect() -> None:
    """Connect the handlers (idempotent: dispatch_uid). Model loading comes first among
    the `worker_process_init` handlers: the others report what it measured."""
    celeryd_init.connect(_on_celeryd_init, weak=False, dispatch_uid="ocrfleet.celeryd_init")
    worker_process_init.connect(
        _on_worker_process_init, weak=False, dispatch_uid="ocrfleet.worker_process_init"
    )
    task_postrun.connect(_on_task_postrun, weak=False, dispatch_uid="ocrfleet.webhook_notify")
