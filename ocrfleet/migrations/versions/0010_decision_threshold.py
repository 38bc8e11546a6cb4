"""regions.threshold: the threshold a region's chosen candidate was held to, so every output
can say why a region was accepted or sent to review (its score against this)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("regions", sa.Column("threshold", sa.Float(), nullable=True))


def _legacy_alter_table(on: bool) -> None:
    """As in 0006: SQLite rebuilds `regions`, and the text views must not stop the rename."""
    if op.get_context().dialect.name == "sqlite":
        op.execute(f"PRAGMA legacy_alter_table = {'ON' if on else 'OFF'}")


def downgrade() -> None:
    _legacy_alter_table(True)
    with op.batch_alter_table("regions") as batch:
        batch.drop_column("threshold")
    _legacy_alter_table(False)
