"""Metrics an SRE asks for, on SQLite and a real HTTP receiver: the review backlog read at
scrape time, and webhook deliveries and failures by event and outcome."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ocrfleet.api.metrics import ReviewBacklog
from ocrfleet.config import Settings
from ocrfleet.db.migrate import upgrade
from ocrfleet.db.models import Document, Page, Region, ReviewFlag, Run
from ocrfleet.db.session import dispose_engines, session_scope
from ocrfleet.webhooks import claim, deliver

RUN = "r" * 64


@pytest.fixture
def db(tmp_path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'metrics.db'}"
    upgrade(url)
    with session_scope(url) as session:
        session.add(Run(id=RUN, config={}))
    yield url
    dispose_engines()


def _document(url: str, status: str, callback_url: str | None = None, n: int = 0) -> int:
    with session_scope(url) as session:
        doc = Document(
            run_id=RUN,
            sha256=f"{n:064d}",
            source_uri="x",
            status=status,
            page_count=1,
            callback_url=callback_url,
        )
        session.add(doc)
        session.flush()
        return doc.id


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[str, ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_review_backlog_counts_open_flags_by_reason_and_the_oldest_age(db: str) -> None:
    registry = CollectorRegistry()
    registry.register(ReviewBacklog(db))
    assert _samples(registry) == {("ocrfleet_review_oldest_open_flag_age_seconds", ()): 0.0}

    doc_id = _document(db, "done")
    now = datetime.now(UTC)
    flags = [  # (reason, status, age)
        ("low_score", "open", timedelta(hours=2)),
        ("low_score", "open", timedelta(minutes=1)),
        ("rule:iban", "open", timedelta(minutes=5)),
        ("low_score", "resolved", timedelta(days=3)),  # worked: not backlog
    ]
    with session_scope(db) as session:
        page = Page(document_id=doc_id, number=1, width=10, height=10, image_uri="p")
        session.add(page)
        session.flush()
        for number, (reason, status, age) in enumerate(flags, start=1):
            region = Region(page_id=page.id, number=number, x0=0, y0=0, x1=1, y1=1)
            session.add(region)
            session.flush()
            session.add(
                ReviewFlag(region_id=region.id, reason=reason, status=status, created_at=now - age)
            )

    samples = _samples(registry)
    oldest = samples.pop(("ocrfleet_review_oldest_open_flag_age_seconds", ()))
    assert 7200 <= oldest < 7200 + 600
    assert samples == {
        ("ocrfleet_review_open_flags", (("reason", "low_score"),)): 2.0,
        ("ocrfleet_review_open_flags", (("reason", "rule:iban"),)): 1.0,
    }


class _Receiver(BaseHTTPRequestHandler):
    status = 200

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(type(self).status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        return


@pytest.fixture
def receiver() -> Iterator[tuple[str, type[_Receiver]]]:
    handler = type("Receiver", (_Receiver,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", handler
    server.shutdown()
    server.server_close()


def _count(name: str, event: str, outcome: str) -> float:
    return REGISTRY.get_sample_value(f"{name}_total", {"event": event, "outcome": outcome}) or 0.0


def test_webhook_deliveries_and_failures_are_counted_by_event_and_outcome(
    db: str, receiver: tuple[str, type[_Receiver]]
) -> None:
    url, handler = receiver
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=db,
        webhook_secret="s",
        webhook_allow_private=True,
        webhook_max_attempts=2,
    )
    names = ("ocrfleet_webhook_deliveries", "ocrfleet_webhook_failures")
    keys = [
        (names[0], "done", "delivered"),
        (names[0], "failed", "gave_up"),
        (names[0], "partial", "refused"),
        (names[1], "failed", "http_5xx"),
        (names[1], "partial", "refused"),
        (names[1], "partial", "connection"),
    ]
    before = {key: _count(*key) for key in keys}

    done = _document(db, "done", url, n=1)
    failed = _document(db, "failed", url, n=2)
    refused = _document(db, "partial", "http://127.0.0.1:9/hook", n=3)
    with session_scope(db) as session:
        assert all(claim(session, doc) for doc in (done, failed, refused))
    assert deliver(settings, done).delivered
    handler.status = 503
    assert not deliver(settings, failed).final  # the first failure is retried
    assert deliver(settings, failed).final  # the second is the last
    private = settings.model_copy(update={"webhook_allow_private": False})
    assert deliver(private, refused).error.startswith("refused")

    after = {key: _count(*key) - before[key] for key in keys}
    assert after == {
        (names[0], "done", "delivered"): 1,
        (names[0], "failed", "gave_up"): 1,
        (names[0], "partial", "refused"): 1,
        (names[1], "failed", "http_5xx"): 2,
        (names[1], "partial", "refused"): 1,
        (names[1], "partial", "connection"): 0,
    }
