"""layout regions and reproducibility: region categories beyond text/formula/table, the
layout block and its lines, candidate truncation / line reading / fallback chain, and the page
input sha256

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_CATEGORIES = "category in ('text','formula','table')"
NEW_CATEGORIES = (
    "category in ('text','formula','table','title','figure','header','footer','reference')"
)

# The views read regions and candidates: SQLite rebuilds those tables in batch mode, so the
# views are dropped first and made again after, as 0001 made them (copied, not imported:
# a revision always makes the same thing).
# Views are frozen here, not built from code, so this revision always makes the same thing.
DOCUMENT_TEXT_LINES = """
CREATE VIEW document_text_lines AS
SELECT
    d.id AS document_id,
    d.run_id AS run_id,
    d.sha256 AS sha256,
    p.number AS page_number,
    r.number AS region_number,
    COALESCE(
        (SELECT c.text FROM candidates c
          WHERE c.region_id = r.id AND c.engine = r.chosen_engine),
        (SELECT c.text FROM candidates c
          WHERE c.region_id = r.id
          ORDER BY CASE WHEN c.error IS NULL THEN 0 ELSE 1 END, c.engine
          LIMIT 1)
    ) AS text,
    r.accepted AS accepted
FROM regions r
JOIN pages p ON p.id = r.page_id
JOIN documents d ON d.id = p.document_id
"""

# One row per document, its region texts joined by newlines in reading order (page, then
# region); '' while it has none. SQLite before 3.44 has no ORDER BY inside aggregates, so
# there group_concat reads a per-document subquery that is already ordered.
DOCUMENT_TEXT = {
    "postgresql": """
CREATE VIEW document_text AS
SELECT
    d.id AS document_id,
    d.run_id AS run_id,
    d.sha256 AS sha256,
    COALESCE(
        (SELECT string_agg(l.text, chr(10) ORDER BY l.page_number, l.region_number)
           FROM document_text_lines l
          WHERE l.document_id = d.id),
        ''
    ) AS text
FROM documents d
""",
    "sqlite": """
CREATE VIEW document_text AS
SELECT
    d.id AS document_id,
    d.run_id AS run_id,
    d.sha256 AS sha256,
    COALESCE(
        (SELECT group_concat(o.text, char(10))
           FROM (SELECT l.text AS text
                   FROM document_text_lines l
                  WHERE l.document_id = d.id
                  ORDER BY l.page_number, l.region_number) AS o),
        ''
    ) AS text
FROM documents d
""",
}



def _drop_views() -> None:
    op.execute("DROP VIEW document_text")
    op.execute("DROP VIEW document_text_lines")


def _create_views() -> None:
    op.execute(DOCUMENT_TEXT_LINES)
    op.execute(DOCUMENT_TEXT[op.get_context().dialect.name])


def upgrade() -> None:
    _drop_views()
    with op.batch_alter_table("pages") as batch:
        batch.add_column(sa.Column("input_sha256", sa.String(length=64), nullable=True))
    with op.batch_alter_table("regions") as batch:
        batch.drop_constraint(op.f("ck_regions_category"), type_="check")
        batch.add_column(sa.Column("block", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("lines", sa.JSON(), nullable=True))
        batch.create_check_constraint(op.f("ck_regions_category"), NEW_CATEGORIES)
    with op.batch_alter_table("candidates") as batch:
        batch.add_column(
            sa.Column("truncated", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("read_as", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("skipped", sa.JSON(), nullable=True))
    with op.batch_alter_table("candidates") as batch:
        batch.alter_column("truncated", server_default=None)
    _create_views()


def downgrade() -> None:
    _drop_views()
    with op.batch_alter_table("candidates") as batch:
        batch.drop_column("skipped")
        batch.drop_column("read_as")
        batch.drop_column("truncated")
    with op.batch_alter_table("regions") as batch:
        batch.drop_constraint(op.f("ck_regions_category"), type_="check")
        batch.drop_column("lines")
        batch.drop_column("block")
        batch.create_check_constraint(op.f("ck_regions_category"), OLD_CATEGORIES)
    with op.batch_alter_table("pages") as batch:
        batch.drop_column("input_sha256")
    _create_views()
