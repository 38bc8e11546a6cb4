"""Document and page states, and the one way to change them.

A status moves only along `DOCUMENT_MOVES` / `PAGE_MOVES`, and only through `move`: an
UPDATE whose WHERE admits just the states the target may be reached from. The guard is in
the SQL, so a redelivered task, a retry racing a late page or a cancel racing an ingest
changes nothing it may not: a `done` page is never set back to `pending`, a `cancelled`
document never back to `processing`. Rows are born in their first state (`pending` from a
submit; `processing`, `rejected` or `failed` from an `ocrfleet run` ingest, which has no
queue to wait in) and move from there.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, and_, case, update
from sqlalchemy.orm import Session

from ocrfleet.db import models
from ocrfleet.ir import DocumentStatus, PageStatus

_D, _P = DocumentStatus, PageStatus

DOCUMENT_MOVES: dict[DocumentStatus, frozenset[DocumentStatus]] = {
    _D.pending: frozenset({_D.processing, _D.rejected, _D.failed, _D.cancelled}),
    _D.processing: frozenset({_D.done, _D.partial, _D.cancelled}),
    _D.done: frozenset({_D.reviewed}),  # its last open review flag closed
    _D.partial: frozenset({_D.processing}),  # `ocrfleet retry`: its failed pages again
    _D.failed: frozenset({_D.pending, _D.processing}),  # retry: ingest again, or pages again
    _D.rejected: frozenset(),
    _D.reviewed: frozenset(),
    _D.cancelled: frozenset(),
}
PAGE_MOVES: dict[PageStatus, frozenset[PageStatus]] = {
    _P.pending: frozenset({_P.done, _P.failed, _P.cancelled}),
    _P.failed: frozenset({_P.pending}),  # retry, with a fresh delivery budget
    # A page already running when its document was cancelled finishes, and says how.
    _P.cancelled: frozenset({_P.done, _P.failed}),
    _P.done: frozenset(),
}

# Documents with work left for the fleet: what the scheduler counts and `status --stuck` shows.
UNFINISHED = frozenset({_D.pending, _D.processing})
# Documents nothing more happens to unless someone asks (a retry, a review): `wait` returns
# on these and the completion webhook fires on them.
TERMINAL = frozenset(DOCUMENT_MOVES) - UNFINISHED
# Documents whose every page was read: `status`, `submit --wait` and `run` exit 0 on these.
SUCCEEDED = frozenset({_D.done, _D.reviewed})


def sources(to: DocumentStatus | PageStatus) -> list[str]:
    """The states a row may move to `to` from, as stored."""
    moves: dict[Any, frozenset[Any]] = (
        DOCUMENT_MOVES if isinstance(to, DocumentStatus) else PAGE_MOVES
    )
    return sorted(state.value for state, targets in moves.items() if to in targets)


def move(
    session: Session,
    row: type[models.Document] | type[models.Page],
    to: DocumentStatus | PageStatus,
    *where: ColumnElement[bool],
    returning: Any = None,
    **values: Any,
) -> list[Any]:
    """Set `status = to` (and `values`) on the rows matching `where` whose state may move
    to `to`; returns `returning` (their id by default) for each row that moved. Rows in any
    other state are left as they are."""
    expected = DocumentStatus if row is models.Document else PageStatus
    if not isinstance(to, expected):
        raise TypeError(f"{row.__tablename__} take a {expected.__name__}, not {to!r}")
    statement = (
        update(row)
        .where(*where, row.status.in_(sources(to)))
        .values(status=to.value, **values)
        .returning(row.id if returning is None else returning)
    )
    return list(session.scalars(statement))


def count_page(session: Session, document_id: int, page: PageStatus) -> DocumentStatus | None:
    """Count a page that just finished as `page` on its document, and finish the document
    (`done`, or `partial` when a page failed) if that was its last: counters and status in
    one UPDATE, so whichever worker finishes the last page finishes the document (no chord,
    no read-modify-write race). A document that may not finish (cancelled) keeps its
    state; its counters count still. Returns the document's status after it."""
    doc = models.Document
    done = doc.pages_done + (1 if page == _P.done else 0)
    failed = doc.pages_failed + (1 if page == _P.failed else 0)
    finishing = and_(
        doc.status.in_(set(sources(_D.done)) & set(sources(_D.partial))),
        done + failed >= doc.page_count,
    )
    status = session.scalar(
        update(doc)
        .where(doc.id == document_id)
        .values(
            pages_done=done,
            pages_failed=failed,
            status=case(
                (and_(finishing, failed > 0), _D.partial.value),
                (finishing, _D.done.value),
                else_=doc.status,
            ),
        )
        .returning(doc.status)
    )
    return None if status is None else DocumentStatus(status)
