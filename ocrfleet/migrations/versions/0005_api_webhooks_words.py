"""HTTP API and webhooks: word boxes per candidate, api_keys, deliveries, callback_url,
document status 'cancelled'

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
OLD_STATUS = "status in ('pending','processing','done','partial','rejected','failed','reviewed')"
NEW_STATUS = (
    "status in ('pending','processing','done','partial','rejected','failed','reviewed',"
    "'cancelled')"
)
CALLBACK_STATE = "callback_state in ('queued','delivered','gave_up')"


def _legacy_alter_table(on: bool) -> None:
    """SQLite changes a CHECK or drops a column by copying the table; the text views name
    `documents` and `candidates`, and without legacy_alter_table the copy's final rename
    refuses while they point at the dropped original (afterwards they point at the copy)."""
    if op.get_context().dialect.name == "sqlite":
        op.execute(f"PRAGMA legacy_alter_table = {'ON' if on else 'OFF'}")


def _documents_status(check: str, add: bool) -> None:
    with op.batch_alter_table("documents") as batch:
        batch.drop_constraint(op.f("ck_documents_status"), type_="check")
        batch.create_check_constraint(op.f("ck_documents_status"), check)
        if add:
            batch.add_column(sa.Column("callback_url", sa.Text(), nullable=True))
            batch.add_column(sa.Column("callback_state", sa.String(length=16), nullable=True))
            batch.create_check_constraint(op.f("ck_documents_callback_state"), CALLBACK_STATE)
        else:
            batch.drop_constraint(op.f("ck_documents_callback_state"), type_="check")
            batch.drop_column("callback_state")
            batch.drop_column("callback_url")


def upgrade() -> None:
    _legacy_alter_table(True)
    with op.batch_alter_table("candidates") as batch:
        batch.add_column(sa.Column("words", sa.JSON(), nullable=True))
    _documents_status(NEW_STATUS, add=True)
    _legacy_alter_table(False)
    op.create_table(
        "api_keys",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_index(op.f("ix_api_keys_tenant"), "api_keys", ["tenant"], unique=False)
    op.create_table(
        "deliveries",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("document_id", ID, nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["document_id"],
            ["documents.id"],
            name=op.f("fk_deliveries_document_id_documents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deliveries")),
        sa.UniqueConstraint(
            "document_id", "attempt", name=op.f("uq_deliveries_document_id_attempt")
        ),
    )


def downgrade() -> None:
    op.drop_table("deliveries")
    op.drop_index(op.f("ix_api_keys_tenant"), table_name="api_keys")
    op.drop_table("api_keys")
    op.execute("UPDATE documents SET status = 'failed' WHERE status = 'cancelled'")
    _legacy_alter_table(True)
    _documents_status(OLD_STATUS, add=False)
    with op.batch_alter_table("candidates") as batch:
        batch.drop_column("words")
    _legacy_alter_table(False)
