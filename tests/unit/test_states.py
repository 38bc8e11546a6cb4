"""The state machine: the transition tables, the guarded move on a real SQLite database
(every pair of states, so a `done` page is never set back to `pending`), a document
finishing with its last page, a cancel closing the pending pages, and the exit codes of
`ocrfleet status` and `ocrfleet results`."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from ocrfleet import client, states
from ocrfleet.cli import run_command
from ocrfleet.config import Settings, get_settings
from ocrfleet.db import models
from ocrfleet.db.migrate import upgrade
from ocrfleet.db.session import dispose_engines, session_scope
from ocrfleet.ir import DocumentStatus, PageStatus
from ocrfleet.operations import _diagnose, _Fleet, _Message
from ocrfleet.scheduler.signals import WorkerSignal
from ocrfleet.service import Context, fail_page

RUN = "r" * 64
_shas = itertools.count()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('states') / 'states.db'}"
    upgrade(url)
    with session_scope(url) as session:
        session.add(models.Run(id=RUN, config={}))
    yield url
    dispose_engines()


def add_document(url: str, status: DocumentStatus, pages: list[PageStatus] = ()) -> int:
    """A document in `status` with pages in the states given."""
    with session_scope(url) as session:
        doc = models.Document(
            run_id=RUN,
            sha256=f"{next(_shas):064x}",
            source_uri="x",
            status=status.value,
            page_count=len(pages) or None,
        )
        session.add(doc)
        session.flush()
        for number, page in enumerate(pages, start=1):
            session.add(
                models.Page(
                    document_id=doc.id,
                    number=number,
                    width=1,
                    height=1,
                    image_uri="",
                    status=page.value,
                )
            )
        return doc.id


def page_states(url: str, doc_id: int) -> list[str]:
    with session_scope(url) as session:
        return list(
            session.scalars(
                select(models.Page.status)
                .where(models.Page.document_id == doc_id)
                .order_by(models.Page.number)
            )
        )


def test_the_tables_cover_every_state_and_split_them_once() -> None:
    assert set(states.DOCUMENT_MOVES) == set(DocumentStatus)
    assert set(states.PAGE_MOVES) == set(PageStatus)
    assert set(DocumentStatus) == states.TERMINAL | states.UNFINISHED
    assert not states.TERMINAL & states.UNFINISHED
    assert states.SUCCEEDED < states.TERMINAL
    # Work finished stays finished: nothing leaves a done page, a done document only gets
    # reviewed, and only a failure goes back to the queue (an operator's retry).
    assert states.PAGE_MOVES[PageStatus.done] == frozenset()
    assert states.DOCUMENT_MOVES[DocumentStatus.done] == {DocumentStatus.reviewed}
    assert states.sources(PageStatus.pending) == ["failed"]
    assert states.sources(DocumentStatus.pending) == ["failed"]
    # Every state can be reached from where rows are born.
    born = {DocumentStatus.pending, DocumentStatus.processing, DocumentStatus.rejected}
    reached, frontier = set(born), set(born)
    while frontier:
        frontier = {t for s in frontier for t in states.DOCUMENT_MOVES[s]} - reached
        reached |= frontier
    assert reached == set(DocumentStatus)


@pytest.mark.parametrize("start", list(PageStatus))
def test_a_page_moves_exactly_along_the_table(db: str, start: PageStatus) -> None:
    page = models.Page
    for to in PageStatus:
        doc_id = add_document(db, DocumentStatus.processing, [start])
        with session_scope(db) as session:
            moved = states.move(session, page, to, page.document_id == doc_id)
        allowed = to in states.PAGE_MOVES[start]
        assert bool(moved) == allowed, (start, to)
        assert page_states(db, doc_id) == [(to if allowed else start).value]


@pytest.mark.parametrize("start", list(DocumentStatus))
def test_a_document_moves_exactly_along_the_table(db: str, start: DocumentStatus) -> None:
    doc = models.Document
    for to in DocumentStatus:
        doc_id = add_document(db, start)
        with session_scope(db) as session:
            moved = states.move(session, doc, to, doc.id == doc_id, reason="why")
            row = session.get(doc, doc_id)
            assert (row.status, row.reason) == (
                (to.value, "why") if to in states.DOCUMENT_MOVES[start] else (start.value, None)
            ), (start, to)
        assert moved == ([doc_id] if to in states.DOCUMENT_MOVES[start] else [])


def test_move_refuses_the_other_kind_of_state(db: str) -> None:
    with session_scope(db) as session, pytest.raises(TypeError, match="PageStatus"):
        states.move(session, models.Page, DocumentStatus.done, models.Page.id == 1)


def test_the_last_page_finishes_the_document(db: str) -> None:
    ctx = Context(Settings(_env_file=None, database_url=db))  # type: ignore[call-arg]
    doc_id = add_document(db, DocumentStatus.processing, [PageStatus.pending] * 2)
    with session_scope(db) as session:
        first, second = session.scalars(
            select(models.Page.id).where(models.Page.document_id == doc_id)
        ).all()
        states.move(session, models.Page, PageStatus.done, models.Page.id == first)
        assert states.count_page(session, doc_id, PageStatus.done) == DocumentStatus.processing
    fail_page(ctx, second, "poison")
    fail_page(ctx, second, "poison")  # a redelivered failure counts once
    with session_scope(db) as session:
        row = session.get(models.Document, doc_id)
        assert (row.status, row.pages_done, row.pages_failed) == ("partial", 1, 1)


def test_cancel_closes_pending_pages_and_a_running_page_still_finishes(db: str) -> None:
    settings = Settings(_env_file=None, database_url=db)  # type: ignore[call-arg]
    doc_id = add_document(
        db, DocumentStatus.processing, [PageStatus.done] + [PageStatus.pending] * 2
    )
    with session_scope(db) as session:
        session.get(models.Document, doc_id).pages_done = 1
    assert client.cancel(doc_id, settings=settings).status == DocumentStatus.cancelled
    assert page_states(db, doc_id) == ["done", "cancelled", "cancelled"]
    with session_scope(db) as session:
        reasons = session.scalars(
            select(models.Page.reason).where(
                models.Page.document_id == doc_id, models.Page.status == "cancelled"
            )
        ).all()
        assert set(reasons) == {client.CANCELLED}
    # Page 2 was already running when the cancel landed: it finishes and is counted, and
    # the document stays cancelled.
    fail_page(Context(settings), _page_id(db, doc_id, 2), "it broke")
    assert page_states(db, doc_id) == ["done", "failed", "cancelled"]
    with session_scope(db) as session:
        row = session.get(models.Document, doc_id)
        assert (row.status, row.pages_done, row.pages_failed) == ("cancelled", 1, 1)
    # A second cancel, and a cancel of a finished document, change nothing.
    assert client.cancel(doc_id, settings=settings).status == DocumentStatus.cancelled
    done = add_document(db, DocumentStatus.done, [PageStatus.done])
    assert client.cancel(done, settings=settings).status == DocumentStatus.done
    assert page_states(db, done) == ["done"]


def _page_id(url: str, doc_id: int, number: int) -> int:
    with session_scope(url) as session:
        return session.scalars(
            select(models.Page.id).where(
                models.Page.document_id == doc_id, models.Page.number == number
            )
        ).one()


def test_every_stuck_row_says_why() -> None:
    since = datetime(2026, 12, 2, 9, 30, tzinfo=UTC)
    ours, theirs = "a" * 64, "b" * 64

    def why(fleet: _Fleet | None, message: _Message | None, run: str = ours) -> tuple[str, str]:
        return _diagnose(fleet, message, run, since, lost_s=300)

    def worker(name: str, queue: str) -> WorkerSignal:
        return WorkerSignal(hostname=name, queues=[queue], age_s=1, load_s=None, busy=False)

    assert why(None, None) == ("no broker", "OCRFLEET_BROKER_URL is not set: no fleet runs it")
    idle = _Fleet(waiting={"gpu": 3}, workers=[worker("w1", "gpu")], runs={"w1": ours})
    assert why(idle, None) == (
        "no message",
        "no message refers to it: the lost-work sweep re-enqueues it once it is 300s old",
    )
    assert why(idle, _Message("gpu", orphaned=True)) == (
        "unacked from gpu, held by no live worker",
        "its worker stopped heartbeating: the orphan sweep requeues it",
    )
    assert why(idle, _Message("gpu", "w1", started=True)) == (
        "running on w1",
        "running on w1 since 2026-12-02 09:30:00Z",
    )
    assert why(idle, _Message("gpu", "w1"))[1] == "reserved by w1, which has not started it yet"
    assert why(idle, _Message("gpu.high")) == (
        "queued in gpu.high",
        "no live worker consumes gpu.high",
    )
    assert why(idle, _Message("gpu")) == (
        "queued in gpu",
        "one of 3 message(s) waiting for 1 live worker(s)",
    )
    assert why(idle, _Message("gpu"), run=theirs) == (
        "queued in gpu",
        f"waiting for a worker of run {theirs[:12]} (live workers run {ours[:12]})",
    )
    # A worker that reads no pages (ingest) names no run: it takes any document.
    ingest = _Fleet(waiting={"ingest": 1}, workers=[worker("i1", "ingest")])
    assert why(ingest, _Message("ingest"), run=theirs)[1].startswith("one of 1 message(s)")


@pytest.fixture
def cli_db(db: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    monkeypatch.setenv("OCRFLEET_DATABASE_URL", db)
    monkeypatch.setenv("OCRFLEET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("OCRFLEET_BROKER_URL", raising=False)
    get_settings.cache_clear()
    yield db
    get_settings.cache_clear()


def test_status_and_results_exit_codes(cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """README's table: 0 done or reviewed, 1 any other state, 2 no such document; the same
    missing document gives the same code from `status` and `results`."""
    codes = {}
    for status in DocumentStatus:
        doc_id = add_document(cli_db, status)
        codes[status] = run_command(["status", str(doc_id), "--json"])
    assert codes == {s: 0 if s in states.SUCCEEDED else 1 for s in DocumentStatus}
    assert run_command(["status", "999999"]) == 2
    assert run_command(["results", "999999"]) == 2
    assert "no document matches '999999'" in capsys.readouterr().err
