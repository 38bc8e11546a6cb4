"""pages.status 'cancelled': cancelling a document closes its pending pages, so the
scheduler's backlog and `status --stuck` see only live work; pages left `pending` under a
document cancelled before this revision are closed too

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = {
    "old": "status in ('pending','done','failed')",
    "new": "status in ('pending','done','failed','cancelled')",
}
UNDER_CANCELLED = "document_id IN (SELECT id FROM documents WHERE status = 'cancelled')"


def _legacy_alter_table(on: bool) -> None:
    """As in 0006: SQLite rebuilds `pages`, and the text views must not stop the rename."""
    if op.get_context().dialect.name == "sqlite":
        op.execute(f"PRAGMA legacy_alter_table = {'ON' if on else 'OFF'}")


def _constraint(which: str) -> None:
    _legacy_alter_table(True)
    with op.batch_alter_table("pages") as batch:
        batch.drop_constraint(op.f("ck_pages_status"), type_="check")
        batch.create_check_constraint(op.f("ck_pages_status"), STATUSES[which])
    _legacy_alter_table(False)


def upgrade() -> None:
    _constraint("new")
    op.execute(
        sa.text(
            "UPDATE pages SET status = 'cancelled', reason = 'cancelled on request' "
            f"WHERE status = 'pending' AND {UNDER_CANCELLED}"
        )
    )


def downgrade() -> None:
    # Before 0011 a cancelled document's unrun pages stayed `pending`: put them back so.
    op.execute(sa.text("UPDATE pages SET status = 'pending' WHERE status = 'cancelled'"))
    _constraint("old")
