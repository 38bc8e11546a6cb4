"""Operator commands on a fleet with no workers running: `ocrfleet status --stuck` says
where each unfinished piece is and why it waits (a cancelled document's pages are not
work), `ocrfleet retry` gives failed pages a fresh budget, and a partial document's status
carries its pages' reasons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from ocrfleet import client
from ocrfleet.scheduler.signals import database_signals
from ocrfleet.service import Context, fail_page
from ocrfleet.service import ingest as ingest_in_process
from ocrfleet.tasks.app import create_app
from tests.integration.fleet_helpers import (
    make_document,
    ocrfleet_cli,
    queue_depths,
    rows,
    settings_from,
)

pytestmark = pytest.mark.integration


def test_stuck_retry_and_partial_reason(env: dict[str, str], tmp_path: Path) -> None:
    settings = settings_from(env)
    url = env["OCRFLEET_DATABASE_URL"]
    conn = redis.Redis.from_url(env["OCRFLEET_BROKER_URL"])

    source = tmp_path / "split.pdf"
    source.write_bytes(make_document(870, 2))
    split = ingest_in_process(Context(settings), str(source))  # pages, no messages
    queued = client.submit(make_document(871, 1), settings=settings)
    taken = client.submit(make_document(872, 1), settings=settings)
    dropped = tmp_path / "dropped.pdf"
    dropped.write_bytes(make_document(873, 2))
    cancelled = ingest_in_process(Context(settings), str(dropped))
    client.cancel(cancelled.document_id, settings=settings)
    # A consumer without a heartbeat holding one message unacknowledged, as a worker whose
    # main process was killed leaves it.
    with create_app(settings).connection_for_read() as connection:
        queue = connection.SimpleQueue("ingest")
        queue.get(timeout=5)
        stuck = ocrfleet_cli(env, "status", "--stuck", "--age", "0", "--json", expect=1)
        queue.close()
    why = {(i["document_id"], i["page"]): (i["where"], i["reason"]) for i in json.loads(stuck)}
    assert set(why) == {(split.document_id, n) for n in (None, 1, 2)} | {
        (queued, None),
        (taken, None),
    }
    assert why[(split.document_id, None)] == ("split into pages", "2 of 2 page(s) pending")
    for number in (1, 2):
        where, reason = why[(split.document_id, number)]
        assert where == "no message" and reason.startswith("no message refers to it: the lost")
    assert {why[(queued, None)], why[(taken, None)]} == {
        ("queued in ingest", "no live worker consumes ingest"),
        (
            "unacked from ingest, held by no live worker",
            "its worker stopped heartbeating: the orphan sweep requeues it",
        ),
    }
    assert json.loads(ocrfleet_cli(env, "status", "--stuck", "--age", "3600", "--json")) == []
    # The cancelled document's pages are closed: no backlog for the scheduler.
    assert rows(
        url, "SELECT DISTINCT status FROM pages WHERE document_id = :d", d=cancelled.document_id
    ) == [("cancelled",)]
    signals = database_signals(url, 0.0)
    assert signals["pending_pages"] == {"high": 0, "normal": 2}  # the split document's
    assert signals["pending_documents"] == 2

    # Both pages fail: the document is partial, and says why.
    ctx = Context(settings)
    for page_id in split.page_ids:
        fail_page(ctx, page_id, "poison: delivered 4 times, exceeds max_deliveries=3")
    (state,) = json.loads(ocrfleet_cli(env, "status", str(split.document_id), "--json", expect=1))
    assert state["status"] == "partial"
    assert state["reason"] == (
        "2 page(s) failed: page 1: poison: delivered 4 times, exceeds max_deliveries=3; "
        "page 2: poison: delivered 4 times, exceeds max_deliveries=3"
    )

    before = queue_depths(env["OCRFLEET_BROKER_URL"])["gpu"]
    out = json.loads(ocrfleet_cli(env, "retry", str(split.document_id), "--json"))
    assert out == [{"document_id": split.document_id, "pages": split.page_ids, "ingest": False}]
    assert rows(
        url,
        "SELECT status, deliveries, reason FROM pages WHERE document_id = :d ORDER BY number",
        d=split.document_id,
    ) == [("pending", 0, None), ("pending", 0, None)]
    assert rows(
        url, "SELECT status, pages_failed, reason FROM documents WHERE id = :d", d=split.document_id
    ) == [("processing", 0, None)]
    assert queue_depths(env["OCRFLEET_BROKER_URL"])["gpu"] == before + 2
    # Nothing left to retry.
    assert "nothing to retry" in ocrfleet_cli(env, "retry", "--failed")
    conn.close()
