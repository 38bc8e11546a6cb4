"""The fleet end to end: real Redis, PostgreSQL, moto's S3 server and worker processes
started with `ocrfleet worker`, documents submitted through `ocrfleet.client.submit`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ocrfleet import client
from tests.integration.fleet_helpers import (
    Workers,
    assert_written_once,
    make_document,
    ocrfleet_cli,
    page_lines,
    page_texts,
    queue_depths,
    rows,
    scalar,
    settings_from,
    start_workers,
    wait_finished,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def workers_factory(tmp_path: Path) -> Iterator[list[Workers]]:
    started: list[Workers] = []
    yield started
    for workers in started:
        workers.stop()


def test_twenty_documents_each_page_written_once(
    env: dict[str, str], tmp_path: Path, workers_factory: list[Workers]
) -> None:
    settings = settings_from(env)
    workers = start_workers(env, tmp_path / "workers.log", queues="gpu,ingest", devices="cpu:2")
    workers_factory.append(workers)

    pages = {doc: 2 + doc % 3 for doc in range(20)}  # 2 to 4 pages each, 59 pages
    blobs = {doc: make_document(doc, count) for doc, count in pages.items()}
    ids = {doc: client.submit(blob, settings=settings) for doc, blob in blobs.items()}
    assert len(set(ids.values())) == 20
    # Same content, same document: nothing new is created or enqueued.
    assert client.submit(blobs[3], settings=settings) == ids[3]

    states = wait_finished(list(ids.values()), settings, timeout=900, workers=workers)
    assert [s.status.value for s in states] == ["done"] * 20, [s.reason for s in states]
    url = env["OCRFLEET_DATABASE_URL"]
    assert_written_once(url)
    for doc, doc_id in ids.items():
        state = client.status(doc_id, settings=settings)
        assert (state.page_count, state.pages_done, state.pages_failed) == (
            pages[doc],
            pages[doc],
            0,
        )
    assert scalar(url, "SELECT count(*) FROM documents") == 20
    assert scalar(url, "SELECT count(*) FROM pages") == sum(pages.values())
    # Each page delivered exactly once in a run without faults.
    assert rows(url, "SELECT DISTINCT deliveries, status FROM pages") == [(1, "done")]
    # Real OCR on every page: the token unique to each page was read on that page.
    for doc in (0, 7, 19):
        texts = page_texts(url, ids[doc])
        for number in range(1, pages[doc] + 1):
            token = page_lines(doc, number)[1].split()[1]
            assert token in texts[number], (doc, number, texts)
    # Nothing left in the queues, nothing unacknowledged.
    assert set(queue_depths(env["OCRFLEET_BROKER_URL"]).values()) == {0}
    # A finished document submitted again stays as it is.
    assert client.submit(blobs[0], settings=settings) == ids[0]
    assert client.status(ids[0], settings=settings).status.value == "done"

    # The command line: `ocrfleet submit --wait` and `ocrfleet status` by path.
    files = [tmp_path / "cli-a.pdf", tmp_path / "cli-b.pdf"]
    files[0].write_bytes(make_document(60, 2))
    files[1].write_bytes(make_document(61, 3))
    submitted = json.loads(
        ocrfleet_cli(env, "submit", *map(str, files), "--wait", "--json", "--timeout", "600")
    )
    assert [(d["status"], d["pages_done"], d["page_count"]) for d in submitted] == [
        ("done", 2, 2),
        ("done", 3, 3),
    ]
    assert [d["meta"]["filename"] for d in submitted] == ["cli-a.pdf", "cli-b.pdf"]
    (by_path,) = json.loads(ocrfleet_cli(env, "status", str(files[1]), "--json"))
    assert by_path["id"] == submitted[1]["id"]
    assert len(json.loads(ocrfleet_cli(env, "status", "--json"))) == 20  # the latest 20


def test_high_priority_overtakes_a_bulk_backlog(
    env: dict[str, str], tmp_path: Path, workers_factory: list[Workers]
) -> None:
    """Bulk documents are queued first, an interactive one last, before any worker runs.
    With the production layout (a CPU ingest worker, a page worker) the interactive
    document is split first and its pages finish before any bulk page."""
    settings = settings_from(env)
    bulk = [client.submit(make_document(50 + i, 2), settings=settings) for i in range(4)]
    urgent = client.submit(make_document(99, 2), priority="high", settings=settings)
    depths = queue_depths(env["OCRFLEET_BROKER_URL"])
    assert (depths["ingest"], depths["ingest.high"]) == (4, 1)

    splitter = start_workers(env, tmp_path / "ingest.log", queues="ingest", concurrency=1)
    workers_factory.append(splitter)
    workers = start_workers(env, tmp_path / "pages.log", queues="gpu", devices="cpu:1")
    workers_factory.append(workers)
    wait_finished([*bulk, urgent], settings, timeout=600, workers=workers)
    assert "started worker ingest" in splitter.log_tail(200_000)

    url = env["OCRFLEET_DATABASE_URL"]
    urgent_last = scalar(
        url, "SELECT max(updated_at) FROM pages WHERE document_id = :doc", doc=urgent
    )
    bulk_first = scalar(
        url,
        "SELECT min(updated_at) FROM pages WHERE document_id = ANY(:docs) AND status = 'done'",
        docs=bulk,
    )
    assert urgent_last < bulk_first
    assert client.status(urgent, settings=settings).priority == "high"
