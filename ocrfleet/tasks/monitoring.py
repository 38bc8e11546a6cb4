"""A worker's Prometheus metrics and its `/healthz` `/readyz` `/metrics` endpoint.

The pool children do the work, so they record the metrics; prometheus-client's
multiprocess mode (`PROMETHEUS_MULTIPROC_DIR`, one folder per worker, set and wiped by the
launcher) lets the main process serve what all of them recorded. The endpoint runs in the
worker's main process on `OCRFLEET_WORKER_HEALTH_PORT` (the launcher gives each device
worker its own port: base + slot):

- `/healthz`: the process is alive and reaches the broker and the database (200/503);
- `/readyz`: its pool process loaded the models (and answered a first page's worth of
  warm-up: model loading runs the engines once), so it can take pages now (200/503).

Recorded per page: pages and regions processed, latency by stage (queue wait, the page
task, the ingest task), the scores written and the share of regions sent to review,
failures and rejected inputs by reason, the model load time and the device memory in use.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from celery.signals import (
    celeryd_init,
    task_postrun,
    task_prerun,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
)

from ocrfleet.config import Settings, get_settings
from ocrfleet.tasks import routing
from ocrfleet.tasks.app import SENT_AT_HEADER
from ocrfleet.tasks.heartbeat import ready_key
from ocrfleet.tasks.lifecycle import context, model_load_seconds

log = logging.getLogger(__name__)

_state: dict[str, Any] = {"started": {}, "server": None}


def _enabled() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class _Metrics:
    """Created on first use, after PROMETHEUS_MULTIPROC_DIR is known."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        latency = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
        self.pages = Counter("ocrfleet_pages_processed_total", "Pages finished", ["status"])
        self.regions = Counter("ocrfleet_regions_processed_total", "Regions written")
        self.latency = Histogram(
            "ocrfleet_stage_seconds", "Time per stage", ["stage"], buckets=latency
        )
        self.scores = Histogram(
            "ocrfleet_score",
            "Scores written",
            ["scorer"],
            buckets=(0.1, 0.3, 0.5, 0.7, 0.9, 0.95, 0.98, 0.99, 0.995, 0.998, 0.999, 1.0),
        )
        self.review = Counter("ocrfleet_regions_flagged_total", "Regions sent to review")
        self.failures = Counter("ocrfleet_failures_total", "Pages or documents failed", ["reason"])
        self.left = Counter(
            "ocrfleet_left_for_run_total",
            "Messages of another run put back for a worker of that run (run: 12 hex)",
            ["run", "task"],
        )
        self.rejections = Counter("ocrfleet_rejections_total", "Inputs rejected", ["reason"])
        self.load = Gauge(
            "ocrfleet_model_load_seconds", "Model load time", multiprocess_mode="livemax"
        )
        self.memory = Gauge(
            "ocrfleet_device_memory_bytes",
            "Memory in use on the worker's device (CUDA allocated, else resident)",
            ["device"],
            multiprocess_mode="livesum",
        )


_metrics: _Metrics | None = None


def metrics() -> _Metrics:
    global _metrics
    if _metrics is None:
        _metrics = _Metrics()
    return _metrics


def count_left(run_id: str, task: str) -> None:
    """One message of run `run_id` put back for a worker of that run (`task`: page or
    ingest); the label is the run's first 12 hex, as `ocrfleet status` shows it."""
    if _enabled():
        metrics().left.labels(run_id[:12], task).inc()


def reason_class(reason: str | None) -> str:
    """A bounded label for a failure reason: its first word ('poison', 'timeout', ...)."""
    if not reason:
        return "unknown"
    head = reason.split(":", 1)[0].strip().split()[0] if reason.strip() else "unknown"
    return head[:40]


def _device_memory() -> tuple[str, float]:
    try:
        import torch

        if torch.cuda.is_available():
            return "cuda", float(torch.cuda.memory_allocated())
    except ImportError:
        pass
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return "cpu", float(resident_pages * os.sysconf("SC_PAGE_SIZE"))


# -- pool children --------------------------------------------------------------------------


def _on_process_init(**_: Any) -> None:
    if not _enabled():
        return
    load = model_load_seconds()
    if load is not None:
        metrics().load.set(load)


_QUEUE_WAIT_STAGES = {
    routing.PAGE_TASK: "queue_wait_page",
    routing.INGEST_TASK: "queue_wait_ingest",
}


def _on_prerun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    if not _enabled() or task is None:
        return
    _state["started"][task_id] = time.monotonic()
    sent_at = getattr(task.request, SENT_AT_HEADER, None)
    if sent_at is None:
        sent_at = (getattr(task.request, "headers", None) or {}).get(SENT_AT_HEADER)
    stage = _QUEUE_WAIT_STAGES.get(task.name)
    if sent_at is not None and stage is not None:  # a webhook's wait is the receiver's
        metrics().latency.labels(stage).observe(max(0.0, time.time() - float(sent_at)))


def _on_postrun(
    task_id: str | None = None, task: Any = None, args: Any = None, retval: Any = None, **_: Any
) -> None:
    if not _enabled() or task is None:
        return
    started = _state["started"].pop(task_id, None)
    m = metrics()
    if task.name == routing.INGEST_TASK:
        if started is not None:
            m.latency.labels("ingest").observe(time.monotonic() - started)
        if isinstance(retval, dict) and retval.get("status") == "failed":
            m.failures.labels(reason_class(retval.get("reason"))).inc()
        if isinstance(retval, dict) and retval.get("status") == "rejected":
            m.rejections.labels(reason_class(retval.get("reason"))).inc()
        return
    if task.name != routing.PAGE_TASK or not args or retval == "left":  # left: not run
        return
    if started is not None:
        m.latency.labels("page").observe(time.monotonic() - started)
    try:
        _record_page(int(args[0]), retval)
    except Exception as exc:  # metrics never fail a page
        log.warning("page metrics not recorded: %s", exc)
    device, used = _device_memory()
    m.memory.labels(device).set(used)


def _record_page(page_id: int, status: Any) -> None:
    from sqlalchemy import func, select

    from ocrfleet.db import models

    m = metrics()
    region, cand, score, flag = models.Region, models.Candidate, models.Score, models.ReviewFlag
    with context().session() as session:
        page = session.get(models.Page, page_id)
        if page is None:
            return
        m.pages.labels(page.status).inc()
        if page.status == "failed":
            m.failures.labels(reason_class(page.reason)).inc()
            return
        regions = session.scalar(select(func.count()).where(region.page_id == page_id)) or 0
        flagged = (
            session.scalar(
                select(func.count())
                .select_from(flag)
                .join(region, region.id == flag.region_id)
                .where(region.page_id == page_id)
            )
            or 0
        )
        scores = session.execute(
            select(score.scorer, score.score)
            .join(cand, cand.id == score.candidate_id)
            .join(region, region.id == cand.region_id)
            .where(region.page_id == page_id, score.score.is_not(None))
        ).all()
    m.regions.inc(regions)
    m.review.inc(flagged)
    for scorer, value in scores:
        m.scores.labels(scorer).observe(value)


def _on_process_shutdown(**_: Any) -> None:
    if _enabled():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid())


# -- the main process: health, readiness and /metrics --------------------------------------


def health() -> tuple[bool, dict[str, Any]]:
    """Broker and database reachable from this process."""
    import redis
    from sqlalchemy import text

    from ocrfleet.db.session import get_engine

    settings = get_settings()
    checks: dict[str, Any] = {}
    try:
        conn = redis.Redis.from_url(settings.broker_url or "", socket_timeout=3)
        checks["broker"] = bool(conn.ping())
        conn.close()
    except Exception as exc:
        checks["broker"] = f"{type(exc).__name__}: {exc}"
    try:
        with get_engine(settings.database_url).connect() as db:
            db.execute(text("SELECT 1"))
        checks["database"] = True
    except Exception as exc:
        checks["database"] = f"{type(exc).__name__}: {exc}"
    return all(v is True for v in checks.values()), checks


def readiness(hostname: str, started_at: float, loads_models: bool) -> tuple[bool, dict[str, Any]]:
    """A pool process of this worker (started after it) reported its models loaded."""
    if not _state.get("consumer_ready"):
        return False, {"consumer": "not started"}
    if not loads_models:
        return True, {"models": "none needed"}
    import redis

    try:
        conn = redis.Redis.from_url(get_settings().broker_url or "", socket_timeout=3)
        raw = conn.get(ready_key(hostname))
        conn.close()
    except Exception as exc:
        return False, {"models": f"cannot read readiness: {exc}"}
    record = json.loads(raw) if raw else None
    if record is None or float(record.get("ready_at", 0)) < started_at:
        return False, {"models": "loading"}
    return True, {"models": "loaded", "load_s": record.get("load_s")}


class _Handler(BaseHTTPRequestHandler):
    server_version = "ocrfleet-worker"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        info = _state["info"]
        if self.path == "/healthz":
            ok, body = health()
            self._reply(200 if ok else 503, json.dumps(body).encode(), "application/json")
        elif self.path == "/readyz":
            ok, body = readiness(info["hostname"], info["started_at"], info["loads_models"])
            self._reply(200 if ok else 503, json.dumps(body).encode(), "application/json")
        elif self.path == "/metrics":
            from prometheus_client import (
                CONTENT_TYPE_LATEST,
                CollectorRegistry,
                generate_latest,
                multiprocess,
            )

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
        else:
            self._reply(404, b"not found\n", "text/plain")

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:  # probes every few seconds: no access log
        return


def serve(hostname: str, queues: list[str], port: int) -> ThreadingHTTPServer:
    """Start the endpoint in a daemon thread of the worker's main process."""
    _state["info"] = {
        "hostname": hostname,
        "started_at": time.time(),
        "loads_models": any(q.startswith("gpu") for q in queues),
    }
    server = ThreadingHTTPServer(("0.0.0.0", port), _Handler)
    threading.Thread(target=server.serve_forever, name="ocrfleet-health", daemon=True).start()
    _state["server"] = server
    log.info("health and metrics on :%d (/healthz /readyz /metrics)", port)
    return server


def _on_celeryd_init(sender: Any = None, options: Any = None, **_: Any) -> None:
    """In the worker's main process, before the pool starts: /healthz answers while the
    models load, /readyz once they are loaded."""
    port = (_state.get("settings") or get_settings()).worker_health_port
    if not port or _state["server"] is not None:
        return
    queues = (options or {}).get("queues") or []
    if isinstance(queues, str):
        queues = queues.split(",")
    serve(str(sender), [str(q).strip() for q in queues], port)


def _on_worker_ready(**_: Any) -> None:
    _state["consumer_ready"] = True


def connect(settings: Settings) -> None:
    """Connect the handlers (idempotent)."""
    _state["settings"] = settings
    celeryd_init.connect(_on_celeryd_init, weak=False, dispatch_uid="ocrfleet.mon.celeryd_init")
    worker_process_init.connect(_on_process_init, weak=False, dispatch_uid="ocrfleet.mon.init")
    task_prerun.connect(_on_prerun, weak=False, dispatch_uid="ocrfleet.mon.prerun")
    task_postrun.connect(_on_postrun, weak=False, dispatch_uid="ocrfleet.mon.postrun")
    worker_process_shutdown.connect(
        _on_process_shutdown, weak=False, dispatch_uid="ocrfleet.mon.shutdown"
    )
    worker_ready.connect(_on_worker_ready, weak=False, dispatch_uid="ocrfleet.mon.ready")
