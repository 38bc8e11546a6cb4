"""scores.verdict 'bounded': a score that is an upper bound, taken before the re-reads
that would refine it because none could lift it to the threshold deciding its region

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-09
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERDICTS = {
    "old": "verdict in ('scored','precheck_failed','render_failed','forward_failed')",
    "new": "verdict in ('scored','bounded','precheck_failed','render_failed','forward_failed')",
}
SCORE_IFF = {
    "old": "(verdict = 'scored') = (score IS NOT NULL)",
    "new": "(verdict in ('scored','bounded')) = (score IS NOT NULL)",
}


def _legacy_alter_table(on: bool) -> None:
    """As in 0006: SQLite rebuilds `scores`, and the text views must not stop the rename."""
    if op.get_context().dialect.name == "sqlite":
        op.execute(f"PRAGMA legacy_alter_table = {'ON' if on else 'OFF'}")


def _constraints(which: str) -> None:
    _legacy_alter_table(True)
    with op.batch_alter_table("scores") as batch:
        batch.drop_constraint(op.f("ck_scores_verdict"), type_="check")
        batch.drop_constraint(op.f("ck_scores_score_iff_scored"), type_="check")
        batch.create_check_constraint(op.f("ck_scores_verdict"), VERDICTS[which])
        batch.create_check_constraint(op.f("ck_scores_score_iff_scored"), SCORE_IFF[which])
    _legacy_alter_table(False)


def upgrade() -> None:
    _constraints("new")


def downgrade() -> None:
    # A bound is not a score: refuse rather than pass one off as 'scored' or drop it.
    bounded = (
        op.get_bind()
        .execute(sa.text("SELECT count(*) FROM scores WHERE verdict = 'bounded'"))
        .scalar_one()
    )
    if bounded:
        raise RuntimeError(
            f"{bounded} score(s) are bounds ('bounded'), which 0006 cannot hold: delete "
            "those runs' results first"
        )
    _constraints("old")
