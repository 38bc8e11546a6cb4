"""review: users, reviews, claims and rule details on flags, documents `reviewed`, and the
text views reading a region's reviewed text first

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
OLD_STATUS = "status in ('pending','processing','done','partial','rejected','failed')"
NEW_STATUS = "status in ('pending','processing','done','partial','rejected','failed','reviewed')"

# A region's text is its latest review's final text (skips do not count), else what 0001's
# view gave: the chosen candidate's, else the first candidate by engine name, successful
# readings first. `reviewed_by` names the reviewer of that latest review.
LATEST_REVIEW = """(SELECT {column} FROM reviews rv {join}
          WHERE rv.region_id = r.id AND rv.action <> 'skip'
          ORDER BY rv.id DESC LIMIT 1)"""
DOCUMENT_TEXT_LINES = f"""
CREATE VIEW document_text_lines AS
SELECT
    d.id AS document_id,
    d.run_id AS run_id,
    d.sha256 AS sha256,
    p.number AS page_number,
    r.number AS region_number,
    COALESCE(
        {LATEST_REVIEW.format(column="rv.final_text", join="")},
        (SELECT c.text FROM candidates c
          WHERE c.region_id = r.id AND c.engine = r.chosen_engine),
        (SELECT c.text FROM candidates c
          WHERE c.region_id = r.id
          ORDER BY CASE WHEN c.error IS NULL THEN 0 ELSE 1 END, c.engine
          LIMIT 1)
    ) AS text,
    r.accepted AS accepted,
    {LATEST_REVIEW.format(column="u.name", join="JOIN users u ON u.id = rv.reviewer_id")}
        AS reviewed_by,
    {LATEST_REVIEW.format(column="rv.action", join="")} AS review_action
FROM regions r
JOIN pages p ON p.id = r.page_id
JOIN documents d ON d.id = p.document_id
"""

# 0001's views, to put back on downgrade.
OLD_DOCUMENT_TEXT_LINES = """
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

# Unchanged from 0001, recreated because it reads document_text_lines.
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


def upgrade() -> None:
    _drop_views()
    op.create_table(
        "users",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("password_hash", sa.Text(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("tenant", sa.String(length=100), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("role in ('reviewer','admin')", name=op.f("ck_users_role")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("name", name=op.f("uq_users_name")),
    )
    with op.batch_alter_table("documents") as batch:
        batch.drop_constraint(op.f("ck_documents_status"), type_="check")
        batch.create_check_constraint(op.f("ck_documents_status"), NEW_STATUS)
    with op.batch_alter_table("review_flags") as batch:
        batch.drop_constraint(op.f("uq_review_flags_region_id"), type_="unique")
        batch.create_unique_constraint(
            op.f("uq_review_flags_region_id_reason"), ["region_id", "reason"]
        )
        batch.add_column(sa.Column("detail", sa.Text(), nullable=True))
        batch.add_column(sa.Column("claimed_by", ID, nullable=True))
        batch.add_column(sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True))
        batch.create_foreign_key(
            op.f("fk_review_flags_claimed_by_users"),
            "users",
            ["claimed_by"],
            ["id"],
            ondelete="SET NULL",
        )
    op.create_table(
        "reviews",
        sa.Column("id", ID, autoincrement=True, nullable=False),
        sa.Column("region_id", ID, nullable=False),
        sa.Column("flag_id", ID, nullable=True),
        sa.Column("reviewer_id", ID, nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("engine", sa.String(length=32), nullable=True),
        sa.Column("final_text", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "action in ('accept','correct','unreadable','skip')", name=op.f("ck_reviews_action")
        ),
        sa.ForeignKeyConstraint(
            ["flag_id"],
            ["review_flags.id"],
            name=op.f("fk_reviews_flag_id_review_flags"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["region_id"],
            ["regions.id"],
            name=op.f("fk_reviews_region_id_regions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["reviewer_id"], ["users.id"], name=op.f("fk_reviews_reviewer_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reviews")),
    )
    op.create_index(op.f("ix_reviews_region_id"), "reviews", ["region_id"], unique=False)
    op.create_index(op.f("ix_reviews_flag_id"), "reviews", ["flag_id"], unique=False)
    op.execute(DOCUMENT_TEXT_LINES)
    op.execute(DOCUMENT_TEXT[op.get_context().dialect.name])


def downgrade() -> None:
    _drop_views()
    op.drop_index(op.f("ix_reviews_flag_id"), table_name="reviews")
    op.drop_index(op.f("ix_reviews_region_id"), table_name="reviews")
    op.drop_table("reviews")
    # Rule flags have no place in 0001's one-flag-per-region table.
    op.execute("DELETE FROM review_flags WHERE reason LIKE 'rule:%'")
    with op.batch_alter_table("review_flags") as batch:
        batch.drop_constraint(op.f("fk_review_flags_claimed_by_users"), type_="foreignkey")
        batch.drop_column("claimed_until")
        batch.drop_column("claimed_by")
        batch.drop_column("detail")
        batch.drop_constraint(op.f("uq_review_flags_region_id_reason"), type_="unique")
        batch.create_unique_constraint(op.f("uq_review_flags_region_id"), ["region_id"])
    op.execute("UPDATE documents SET status = 'done' WHERE status = 'reviewed'")
    with op.batch_alter_table("documents") as batch:
        batch.drop_constraint(op.f("ck_documents_status"), type_="check")
        batch.create_check_constraint(op.f("ck_documents_status"), OLD_STATUS)
    op.drop_table("users")
    op.execute(OLD_DOCUMENT_TEXT_LINES)
    op.execute(DOCUMENT_TEXT[op.get_context().dialect.name])
