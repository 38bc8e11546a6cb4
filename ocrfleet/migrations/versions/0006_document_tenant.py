"""documents.tenant, from meta's "tenant": a document is unique per (sha256, run, tenant),
so the same file from two tenants is two documents; a tenant's documents are indexed in id
order

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-08
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BACKFILL = {
    "postgresql": "UPDATE documents SET tenant = meta->>'tenant' WHERE meta->>'tenant' IS NOT NULL",
    "sqlite": "UPDATE documents SET tenant = json_extract(meta, '$.tenant') "
    "WHERE json_extract(meta, '$.tenant') IS NOT NULL",
}
SHARED_CONTENT = """
SELECT count(*) FROM (
    SELECT sha256, run_id FROM documents GROUP BY sha256, run_id HAVING count(*) > 1
) AS shared
"""


def _legacy_alter_table(on: bool) -> None:
    """As in 0005: SQLite rebuilds `documents` to change its unique constraint, and the
    text views that name it would make the copy's final rename refuse."""
    if op.get_context().dialect.name == "sqlite":
        op.execute(f"PRAGMA legacy_alter_table = {'ON' if on else 'OFF'}")


def upgrade() -> None:
    _legacy_alter_table(True)
    with op.batch_alter_table("documents") as batch:
        batch.add_column(
            sa.Column("tenant", sa.String(length=128), server_default="", nullable=False)
        )
        batch.drop_constraint(op.f("uq_documents_sha256_run_id"), type_="unique")
        batch.create_unique_constraint(
            op.f("uq_documents_sha256_run_id_tenant"), ["sha256", "run_id", "tenant"]
        )
    _legacy_alter_table(False)
    # Rows were unique on (sha256, run_id) until now, so the backfill cannot collide.
    op.execute(BACKFILL[op.get_context().dialect.name])
    op.create_index("ix_documents_tenant_id", "documents", ["tenant", "id"])


def downgrade() -> None:
    # Two tenants' documents of one content would become one: refuse rather than delete
    # a tenant's work. meta["tenant"] still names every document's tenant.
    shared = op.get_bind().execute(sa.text(SHARED_CONTENT)).scalar_one()
    if shared:
        raise RuntimeError(
            f"{shared} content(s) are documents of more than one tenant; 0005 allows one "
            "document per (sha256, run_id): delete the extra documents first"
        )
    op.drop_index("ix_documents_tenant_id", table_name="documents")
    _legacy_alter_table(True)
    with op.batch_alter_table("documents") as batch:
        batch.drop_constraint(op.f("uq_documents_sha256_run_id_tenant"), type_="unique")
        batch.create_unique_constraint(op.f("uq_documents_sha256_run_id"), ["sha256", "run_id"])
        batch.drop_column("tenant")
    _legacy_alter_table(False)
