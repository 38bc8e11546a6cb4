"""Ingest through the real service on a real database and store: every bad input ends as a
terminal `rejected` row with its specific reason, and the inputs after it go on."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select, text

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.db import models
from ocrfleet.db.migrate import upgrade
from ocrfleet.db.session import get_engine, session_scope
from ocrfleet.runs import PinMismatch, RunConfigError
from ocrfleet.service import Context, IngestOutcome, ingest, process_page
from tests.fixtures.badinputs import BadInput, cases, pdf_bytes

pytestmark = pytest.mark.integration


def context(db_url: str, tmp_path: Path, **overrides: object) -> Context:
    upgrade(db_url)
    return Context(
        Settings(database_url=db_url, store_url=f"file://{tmp_path / 'store'}", **overrides)
    )


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.name)
def test_bad_input_is_rejected_with_its_reason(
    case: BadInput, sqlite_url: str, tmp_path: Path
) -> None:
    ctx = context(sqlite_url, tmp_path, **case.settings)
    outcome = ingest(ctx, f"upload/{case.name}", data=case.data)
    assert outcome.status == ir.DocumentStatus.rejected
    assert outcome.reason is not None and outcome.reason.startswith(case.reason + ":")
    assert outcome.page_ids == []
    with ctx.session() as session:
        doc = session.get(models.Document, outcome.document_id)
        assert (doc.status, doc.reason) == ("rejected", outcome.reason)
    # Redelivery of the same message changes nothing.
    again = ingest(ctx, f"upload/{case.name}", data=case.data)
    assert (again.document_id, again.status, again.created) == (
        outcome.document_id,
        ir.DocumentStatus.rejected,
        False,
    )


def test_a_batch_with_bad_inputs_goes_on(db_url: str, tmp_path: Path) -> None:
    """On SQLite and PostgreSQL: bad inputs between good ones; the good ones complete."""
    ctx = context(db_url, tmp_path, max_pages=4)
    bad = [c for c in cases() if not c.settings]
    good = pdf_bytes(pages=2)
    outcomes = [ingest(ctx, f"upload/{c.name}", data=c.data) for c in bad]
    done = ingest(ctx, "upload/good.pdf", data=good)
    assert {o.status for o in outcomes} == {ir.DocumentStatus.rejected}
    assert len(done.page_ids) == 2
    for page_id in done.page_ids:
        assert process_page(ctx, page_id) == ir.PageStatus.done
    with ctx.session() as session:
        doc = session.get(models.Document, done.document_id)
        assert (doc.status, doc.pages_done) == ("done", 2)


def test_one_document_per_tenant(db_url: str, tmp_path: Path) -> None:
    """The same bytes under two tenants are two documents with their own pages; the same
    tenant again is the first document, and no tenant is a third."""
    ctx = context(db_url, tmp_path)
    data = pdf_bytes(pages=1)

    def ingest_as(tenant: str | None) -> IngestOutcome:
        metadata = None if tenant is None else {"tenant": tenant}
        return ingest(ctx, "upload/same.pdf", data=data, metadata=metadata)

    acme, globex, acme_again, untenanted = map(ingest_as, ["acme", "globex", "acme", None])
    assert (acme_again.document_id, acme_again.created) == (acme.document_id, False)
    assert len({acme.document_id, globex.document_id, untenanted.document_id}) == 3
    assert len({*acme.page_ids, *globex.page_ids, *untenanted.page_ids}) == 3
    with ctx.session() as session:
        tenants = session.execute(
            select(models.Document.id, models.Document.tenant).order_by(models.Document.id)
        ).all()
    assert tenants == [
        (acme.document_id, "acme"),
        (globex.document_id, "globex"),
        (untenanted.document_id, ""),
    ]


def test_on_split_is_called_for_an_input_new_to_the_run_only(db_url: str, tmp_path: Path) -> None:
    """`ocrfleet run` loads its models (or starts its workers) from the first input it will
    split, told its page count: a rerun of known inputs starts nothing."""
    ctx = context(db_url, tmp_path)
    data = pdf_bytes(pages=2)
    calls: list[tuple[str, int]] = []
    first = ingest(ctx, "upload/a.pdf", data=data, on_split=lambda n: calls.append(("a", n)))
    again = ingest(ctx, "upload/b.pdf", data=data, on_split=lambda n: calls.append(("b", n)))
    assert calls == [("a", 2)] and first.created and not again.created
    assert again.document_id == first.document_id


def test_a_pinned_run_needs_no_engine_files_and_must_match(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    """An upload service pins OCRFLEET_RUN_ID: it submits under the run a worker registered,
    and a worker whose settings make another run refuses to work."""
    from ocrfleet import client
    from ocrfleet.service import Context

    upgrade(pg_url)
    fleet = Settings(
        database_url=pg_url, store_url=f"file://{tmp_path / 'store'}", broker_url=redis_url
    )
    registered = Context(fleet).run_id
    pinned = fleet.model_copy(update={"run_id": "f" * 64})
    with pytest.raises(client.SubmitError, match="is not registered"):
        client.submit(pdf_bytes(pages=1), settings=pinned)

    submitter = fleet.model_copy(update={"run_id": registered})
    document_id = client.submit(pdf_bytes(pages=1), settings=submitter)
    with session_scope(pg_url) as session:
        assert session.get(models.Document, document_id).run_id == registered

    # An ingest process pinned to the run needs none of the engines' files to work under it.
    no_models = submitter.model_copy(update={"engines": ["minicpm"], "minicpm_model_path": None})
    assert Context(no_models).run_id == registered
    with pytest.raises(RunConfigError, match="OCRFLEET_MINICPM_MODEL_PATH.*OCRFLEET_RUN_ID"):
        Context(no_models.model_copy(update={"run_id": None})).run_id  # noqa: B018
    # A process that reads pages computes its run and refuses a pin it does not match.
    wrong = fleet.model_copy(update={"run_id": registered, "dpi": 150})
    assert Context(wrong).run_id == registered
    with pytest.raises(PinMismatch, match="OCRFLEET_RUN_ID"):
        Context(wrong).own_run_id  # noqa: B018
    with pytest.raises(RunConfigError, match="is not registered"):
        Context(fleet.model_copy(update={"run_id": "f" * 64})).run_id  # noqa: B018


def test_a_document_cancelled_while_its_ingest_splits_it_gets_no_pages(
    pg_url: str, tmp_path: Path
) -> None:
    """The cancel commits between the ingest's first look (still `pending`) and its write:
    the guarded move leaves the document cancelled, no page row is made, and the page
    images written for it are deleted again."""
    ctx = context(pg_url, tmp_path)
    data = pdf_bytes(pages=2)
    with ctx.session() as session:  # the row `client.submit` makes
        session.add(
            models.Document(
                run_id=ctx.run_id,
                sha256=hashlib.sha256(data).hexdigest(),
                source_uri="upload/late.pdf",
                status="pending",
            )
        )
    canceller = get_engine(pg_url).connect()
    transaction = canceller.begin()
    (doc_id,) = canceller.execute(
        text("UPDATE documents SET status = 'cancelled' RETURNING id")
    ).one()
    outcome: list[IngestOutcome] = []
    ingesting = threading.Thread(
        target=lambda: outcome.append(ingest(ctx, "upload/late.pdf", data=data))
    )
    ingesting.start()
    deadline = time.monotonic() + 120
    while ingesting.is_alive() and time.monotonic() < deadline:
        # Until the ingest waits for the cancel's row lock (a fresh statistics snapshot
        # each time: the canceller's transaction would keep its first).
        with get_engine(pg_url).connect() as watcher:
            waiting = watcher.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            ).scalar_one()
        if waiting:
            break
        time.sleep(0.05)
    transaction.commit()
    canceller.close()
    ingesting.join(timeout=60)
    (late,) = outcome
    assert (late.document_id, late.status, late.page_ids, late.created) == (
        doc_id,
        ir.DocumentStatus.cancelled,
        [],
        False,
    )
    with ctx.session() as session:
        assert session.scalars(select(models.Page.id)).all() == []
    assert not list((tmp_path / "store").rglob("*.png"))
