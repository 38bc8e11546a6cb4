"""The HTTP API's `/metrics`: requests and latency per route, and the review backlog.

`ocrfleet api --workers N` runs N processes, and a scrape reaches one of them: with more
than one, prometheus-client's multiprocess mode keeps each process's counts in files under
PROMETHEUS_MULTIPROC_DIR (`multiprocess_dir`, set before the workers start), and whichever
process answers serves the sum. The review backlog is not counted by anyone: it is read
from the database when scraped (`ReviewBacklog`), one query over the open flags.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from ocrfleet.db import models
from ocrfleet.db.session import session_scope

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir(cache_dir: Path, port: int) -> Path:
    """An empty folder for the metric files of the API on `port` (two APIs on one host
    never share one); emptied at every start, as prometheus-client requires."""
    folder = Path(cache_dir).absolute() / "prometheus" / f"api-{port}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _multiprocess() -> bool:
    return bool(os.environ.get(MULTIPROC_ENV))


class ReviewBacklog(Collector):
    """Open review flags by reason, and the age of the oldest (0 when none is open), read
    at scrape time: `ix_review_flags_status` keeps it to the open rows."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url

    def collect(self) -> Iterator[Metric]:
        flag = models.ReviewFlag
        try:
            with session_scope(self.database_url) as session:
                rows = session.execute(
                    select(flag.reason, func.count(), func.min(flag.created_at))
                    .where(flag.status == "open")
                    .group_by(flag.reason)
                ).all()
        except Exception as exc:  # the request metrics are still served
            log.warning("review backlog not read: %s", exc)
            return
        now = datetime.now(UTC)
        flags = GaugeMetricFamily(
            "ocrfleet_review_open_flags", "Review flags waiting for a person", labels=["reason"]
        )
        oldest = 0.0
        for reason, count, first in rows:
            flags.add_metric([reason], count)
            first = first if first.tzinfo else first.replace(tzinfo=UTC)  # SQLite: naive UTC
            oldest = max(oldest, (now - first).total_seconds())
        yield flags
        yield GaugeMetricFamily(
            "ocrfleet_review_oldest_open_flag_age_seconds",
            "Seconds the oldest open review flag has waited (0: none open)",
            value=oldest,
        )


class ApiMetrics:
    """The API's metrics and their exposition, in one process or summed over several."""

    def __init__(self, database_url: str) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "ocrfleet_api_requests",
            "HTTP API requests by route and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "ocrfleet_api_request_seconds",
            "HTTP API request latency",
            ["method", "route"],
            registry=self.registry,
        )
        self.backlog = ReviewBacklog(database_url)
        self.registry.register(self.backlog)

    def exposition(self) -> bytes:
        """The text format of every process's counts and the backlog as of now."""
        if not _multiprocess():
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        registry.register(self.backlog)
        return generate_latest(registry)


class Measure:
    """ASGI middleware counting requests and timing them per route template (a plain ASGI
    wrapper: Starlette's BaseHTTPMiddleware costs more than a status lookup does)."""

    def __init__(self, app: Any, metrics: ApiMetrics) -> None:
        self.app, self.requests, self.latency = app, metrics.requests, metrics.latency

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def send_status(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.requests.labels(scope["method"], route, str(status[0])).inc()
            self.latency.labels(scope["method"], route).observe(time.perf_counter() - started)
