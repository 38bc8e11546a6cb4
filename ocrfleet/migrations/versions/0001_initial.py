"""initial schema: tables, constraints, indexes and the two text views

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The text of a region is its chosen candidate's, else (no decision yet, or the choice has
# no candidate row) the first candidate by engine name, successful readings first.
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


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    op.create_table(
        "documents",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("source_uri", sa.Text(), nullable=False),
        sa.Column("media_type", sa.String(length=100), nullable=True),
        sa.Column("byte_size", sa.BigInteger(), nullable=True),
        sa.Column("page_count", sa.Integer(), nullable=True),
        sa.Column("pages_done", sa.Integer(), nullable=False),
        sa.Column("pages_failed", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("priority", sa.String(length=16), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status in ('pending','processing','done','partial','rejected','failed')",
            name=op.f("ck_documents_status"),
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_documents_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_documents")),
        sa.UniqueConstraint("sha256", "run_id", name=op.f("uq_documents_sha256_run_id")),
    )
    op.create_index(op.f("ix_documents_run_id"), "documents", ["run_id"], unique=False)
    op.create_index(op.f("ix_documents_status"), "documents", ["status"], unique=False)
    op.create_table(
        "pages",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column(
            "document_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("height", sa.Integer(), nullable=False),
        sa.Column("image_uri", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("deliveries", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("params", sa.JSON(), nullable=True),
        sa.Column("output_sha256", sa.String(length=64), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("status in ('pending','done','failed')", name=op.f("ck_pages_status")),
        sa.ForeignKeyConstraint(
            ["document_id"],
            ["documents.id"],
            name=op.f("fk_pages_document_id_documents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pages")),
        sa.UniqueConstraint("document_id", "number", name=op.f("uq_pages_document_id_number")),
    )
    op.create_index(op.f("ix_pages_status"), "pages", ["status"], unique=False)
    op.create_table(
        "regions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("page_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("category", sa.String(length=16), nullable=False),
        sa.Column("x0", sa.Integer(), nullable=False),
        sa.Column("y0", sa.Integer(), nullable=False),
        sa.Column("x1", sa.Integer(), nullable=False),
        sa.Column("y1", sa.Integer(), nullable=False),
        sa.Column("det_score", sa.Float(), nullable=True),
        sa.Column("chosen_engine", sa.String(length=32), nullable=True),
        sa.Column("accepted", sa.Boolean(), nullable=True),
        sa.CheckConstraint(
            "category in ('text','formula','table')", name=op.f("ck_regions_category")
        ),
        sa.ForeignKeyConstraint(
            ["page_id"], ["pages.id"], name=op.f("fk_regions_page_id_pages"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_regions")),
        sa.UniqueConstraint("page_id", "number", name=op.f("uq_regions_page_id_number")),
    )
    op.create_table(
        "candidates",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column(
            "region_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("engine", sa.String(length=32), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["region_id"],
            ["regions.id"],
            name=op.f("fk_candidates_region_id_regions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_candidates")),
        sa.UniqueConstraint("region_id", "engine", name=op.f("uq_candidates_region_id_engine")),
    )
    op.create_table(
        "review_flags",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column(
            "region_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("resolved_text", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("status in ('open','resolved')", name=op.f("ck_review_flags_status")),
        sa.ForeignKeyConstraint(
            ["region_id"],
            ["regions.id"],
            name=op.f("fk_review_flags_region_id_regions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_review_flags")),
        sa.UniqueConstraint("region_id", name=op.f("uq_review_flags_region_id")),
    )
    op.create_index(op.f("ix_review_flags_status"), "review_flags", ["status"], unique=False)
    op.create_table(
        "scores",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column(
            "candidate_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("scorer", sa.String(length=32), nullable=False),
        sa.Column("scorer_version", sa.Text(), nullable=False),
        sa.Column("verdict", sa.String(length=16), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "(verdict = 'scored') = (score IS NOT NULL)", name=op.f("ck_scores_score_iff_scored")
        ),
        sa.CheckConstraint(
            "verdict in ('scored','precheck_failed','render_failed','forward_failed')",
            name=op.f("ck_scores_verdict"),
        ),
        sa.ForeignKeyConstraint(
            ["candidate_id"],
            ["candidates.id"],
            name=op.f("fk_scores_candidate_id_candidates"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scores")),
        sa.UniqueConstraint("candidate_id", "scorer", name=op.f("uq_scores_candidate_id_scorer")),
    )
    op.execute(DOCUMENT_TEXT_LINES)
    op.execute(DOCUMENT_TEXT[op.get_context().dialect.name])


def downgrade() -> None:
    op.execute("DROP VIEW document_text")
    op.execute("DROP VIEW document_text_lines")
    op.drop_table("scores")
    op.drop_index(op.f("ix_review_flags_status"), table_name="review_flags")
    op.drop_table("review_flags")
    op.drop_table("candidates")
    op.drop_table("regions")
    op.drop_index(op.f("ix_pages_status"), table_name="pages")
    op.drop_table("pages")
    op.drop_index(op.f("ix_documents_status"), table_name="documents")
    op.drop_index(op.f("ix_documents_run_id"), table_name="documents")
    op.drop_table("documents")
    op.drop_table("runs")
