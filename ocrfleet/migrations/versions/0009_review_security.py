"""review app sessions, roles and decision versions (issue 18): a per-user session
generation and a disabled mark, login attempts shared by every app process, and the
decision a review overrides. Accounts without a tenant were global; they are made global
explicitly (tenant '*'), since a tenantless account now sees only tenantless documents.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _legacy_alter_table(on: bool) -> None:
    """As in 0006: SQLite rebuilds `reviews` for its new foreign key, and the text views
    that name it would make the copy's final rename refuse."""
    if op.get_context().dialect.name == "sqlite":
        op.execute(f"PRAGMA legacy_alter_table = {'ON' if on else 'OFF'}")


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(
            sa.Column("session_generation", sa.Integer(), server_default="0", nullable=False)
        )
        batch.add_column(sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE users SET tenant = '*' WHERE tenant IS NULL")
    op.create_table(
        "login_attempts",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("window_start", sa.Float(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_login_attempts")),
    )
    _legacy_alter_table(True)
    with op.batch_alter_table("reviews") as batch:
        batch.add_column(
            sa.Column("overrides_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"))
        )
        batch.create_foreign_key(
            op.f("fk_reviews_overrides_id_reviews"),
            "reviews",
            ["overrides_id"],
            ["id"],
            ondelete="SET NULL",
        )
    _legacy_alter_table(False)


def downgrade() -> None:
    _legacy_alter_table(True)
    with op.batch_alter_table("reviews") as batch:
        batch.drop_constraint(op.f("fk_reviews_overrides_id_reviews"), type_="foreignkey")
        batch.drop_column("overrides_id")
    op.drop_table("login_attempts")
    op.execute("UPDATE users SET tenant = NULL WHERE tenant = '*'")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("disabled_at")
        batch.drop_column("session_generation")
    _legacy_alter_table(False)
