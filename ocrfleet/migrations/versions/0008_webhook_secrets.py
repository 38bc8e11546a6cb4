"""per-key webhook secrets (issue 18): api_keys.webhook_secret, each existing key given a
new random one; documents.webhook_key_id, the key whose secret signs a document's
callbacks; deliveries.delivery, the id of the webhook an attempt belongs to (a document
now has its completion and any number of `reviewed` events)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The completion's delivery id, as webhooks.payload makes it: "<document id>-<status>".
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
BACKFILL_DELIVERY = "UPDATE deliveries SET delivery = CAST(document_id AS VARCHAR) || '-' || event"


def _legacy_alter_table(on: bool) -> None:
    """As in 0006: SQLite rebuilds `documents`, and the text views that name it would make
    the copy's final rename refuse."""
    if op.get_context().dialect.name == "sqlite":
        op.execute(f"PRAGMA legacy_alter_table = {'ON' if on else 'OFF'}")


def upgrade() -> None:
    bind = op.get_bind()
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("webhook_secret", sa.String(length=64), nullable=True))
    keys = sa.table("api_keys", sa.column("id", ID), sa.column("webhook_secret"))
    for (key_id,) in bind.execute(sa.select(keys.c.id)).all():
        bind.execute(
            keys.update()
            .where(keys.c.id == key_id)
            .values(webhook_secret="whsec_" + secrets.token_urlsafe(32))
        )
    with op.batch_alter_table("api_keys") as batch:
        batch.alter_column("webhook_secret", existing_type=sa.String(length=64), nullable=False)

    _legacy_alter_table(True)
    with op.batch_alter_table("documents") as batch:
        batch.add_column(sa.Column("webhook_key_id", ID, nullable=True))
        batch.create_foreign_key(
            op.f("fk_documents_webhook_key_id_api_keys"), "api_keys", ["webhook_key_id"], ["id"]
        )
    _legacy_alter_table(False)

    with op.batch_alter_table("deliveries") as batch:
        batch.add_column(sa.Column("delivery", sa.String(length=64), nullable=True))
    op.execute(BACKFILL_DELIVERY)
    with op.batch_alter_table("deliveries") as batch:
        batch.alter_column("delivery", existing_type=sa.String(length=64), nullable=False)
        batch.drop_constraint(op.f("uq_deliveries_document_id_attempt"), type_="unique")
        batch.create_unique_constraint(
            op.f("uq_deliveries_document_id_delivery_attempt"),
            ["document_id", "delivery", "attempt"],
        )


def downgrade() -> None:
    # Before 0008 a document had one webhook: keep the completion's attempts, drop the
    # `reviewed` events' (0007 cannot tell them apart). Signing falls back to the one
    # OCRFLEET_WEBHOOK_SECRET.
    op.execute("DELETE FROM deliveries WHERE event = 'reviewed'")
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_constraint(op.f("uq_deliveries_document_id_delivery_attempt"), type_="unique")
        batch.create_unique_constraint(
            op.f("uq_deliveries_document_id_attempt"), ["document_id", "attempt"]
        )
        batch.drop_column("delivery")
    _legacy_alter_table(True)
    with op.batch_alter_table("documents") as batch:
        batch.drop_constraint(op.f("fk_documents_webhook_key_id_api_keys"), type_="foreignkey")
        batch.drop_column("webhook_key_id")
    _legacy_alter_table(False)
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("webhook_secret")
