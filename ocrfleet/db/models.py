"""The database of record. Every table has a natural key so every write can be an upsert
and a redelivered task changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ocrfleet import ir

# All key columns in index and unique names: with only the first one, a later
# Index("status", "created_at") would collide with the existing ix on "status".
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

IdType = BigInteger().with_variant(Integer(), "sqlite")
REGION_CATEGORIES = (
    "'text','formula','table','title','figure','header','footer','reference'"  # ir.Category
)
TENANT_FIELD = "tenant"  # the submission metadata key that names the tenant
TENANT_LENGTH = 128


def _values(states: type[ir.DocumentStatus] | type[ir.PageStatus]) -> str:
    """An enum's values as an SQL list, for the CHECK constraint that keeps a column to them."""
    return ",".join(f"'{state.value}'" for state in states)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON}


class Run(Base):
    """One frozen configuration; `id` is the hash of `config`'s canonical JSON."""

    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    config: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


def metadata_tenant(metadata: dict[str, Any] | None) -> str:
    """`documents.tenant` for a submission's metadata: its "tenant", "" for none. Metadata
    is where a submitter names the tenant, so every writer and finder of documents derives
    the column here and the two cannot disagree."""
    tenant = (metadata or {}).get(TENANT_FIELD)
    if tenant is None:
        return ""
    if not isinstance(tenant, str) or len(tenant) > TENANT_LENGTH:
        raise ValueError(f"a tenant is a string of at most {TENANT_LENGTH} characters")
    return tenant


# Documents' natural key (their unique constraint): every upsert of a document uses it.
DOCUMENT_KEY = ("sha256", "run_id", "tenant")


class Document(Base):
    """One input under one run for one tenant: the same bytes submitted by two tenants are
    two documents, processed and seen separately; by one tenant twice, one document."""

    __tablename__ = "documents"
    __table_args__ = (
        UniqueConstraint(*DOCUMENT_KEY),
        # A tenant's documents in id order: the API's listing and the review app's filter.
        Index("ix_documents_tenant_id", "tenant", "id"),
        CheckConstraint(f"status in ({_values(ir.DocumentStatus)})", name="status"),
        CheckConstraint(
            "callback_state in ('queued','delivered','gave_up')", name="callback_state"
        ),
    )
    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    sha256: Mapped[str] = mapped_column(String(64))
    # metadata_tenant(meta): "" when there is none (`ocrfleet run`, an untenanted client).
    tenant: Mapped[str] = mapped_column(String(TENANT_LENGTH), default="", server_default="")
    source_uri: Mapped[str] = mapped_column(Text)
    media_type: Mapped[str | None] = mapped_column(String(100))
    byte_size: Mapped[int | None] = mapped_column(BigInteger)
    page_count: Mapped[int | None] = mapped_column(Integer)
    pages_done: Mapped[int] = mapped_column(Integer, default=0)
    pages_failed: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    reason: Mapped[str | None] = mapped_column(Text)
    priority: Mapped[str] = mapped_column(String(16), default="normal")
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Completion webhook: where to POST on a terminal state, and how far that got (NULL:
    # not yet claimed; set once, by the one process that enqueues the delivery).
    callback_url: Mapped[str | None] = mapped_column(Text)
    callback_state: Mapped[str | None] = mapped_column(String(16))
    # The API key whose webhook secret signs the callbacks (NULL: submitted without one,
    # signed with OCRFLEET_WEBHOOK_SECRET).
    webhook_key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )


class Page(Base):
    __tablename__ = "pages"
    __table_args__ = (
        UniqueConstraint("document_id", "number"),
        CheckConstraint(f"status in ({_values(ir.PageStatus)})", name="status"),
    )
    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    document_id: Mapped[int] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    width: Mapped[int] = mapped_column(Integer)
    height: Mapped[int] = mapped_column(Integer)
    image_uri: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    deliveries: Mapped[int] = mapped_column(Integer, default=0)
    reason: Mapped[str | None] = mapped_column(Text)
    params: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    input_sha256: Mapped[str | None] = mapped_column(String(64))  # of the page image's PNG
    output_sha256: Mapped[str | None] = mapped_column(String(64))
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )


class Region(Base):
    __tablename__ = "regions"
    __table_args__ = (
        UniqueConstraint("page_id", "number"),
        CheckConstraint(f"category in ({REGION_CATEGORIES})", name="category"),
    )
    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    page_id: Mapped[int] = mapped_column(ForeignKey("pages.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    category: Mapped[str] = mapped_column(String(16), default="text")
    x0: Mapped[int] = mapped_column(Integer)
    y0: Mapped[int] = mapped_column(Integer)
    x1: Mapped[int] = mapped_column(Integer)
    y1: Mapped[int] = mapped_column(Integer)
    det_score: Mapped[float | None] = mapped_column(Float)
    block: Mapped[int | None] = mapped_column(Integer)
    lines: Mapped[list[list[int]] | None] = mapped_column(JSON)  # [x0, y0, x1, y1] each
    chosen_engine: Mapped[str | None] = mapped_column(String(32))
    accepted: Mapped[bool | None]
    threshold: Mapped[float | None] = mapped_column(Float)  # the decision's; see ir.Decision


class Candidate(Base):
    __tablename__ = "candidates"
    __table_args__ = (UniqueConstraint("region_id", "engine"),)
    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    region_id: Mapped[int] = mapped_column(ForeignKey("regions.id", ondelete="CASCADE"))
    engine: Mapped[str] = mapped_column(String(32))
    text: Mapped[str] = mapped_column(Text, default="")
    confidence: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    truncated: Mapped[bool] = mapped_column(default=False)
    read_as: Mapped[str | None] = mapped_column(String(16))
    skipped: Mapped[list[str] | None] = mapped_column(JSON)
    # ir.Word dicts in page pixels; NULL for rows written before word boxes existed.
    words: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)


class Score(Base):
    __tablename__ = "scores"
    __table_args__ = (
        UniqueConstraint("candidate_id", "scorer"),
        CheckConstraint(
            "verdict in ('scored','bounded','precheck_failed','render_failed','forward_failed')",
            name="verdict",
        ),
        CheckConstraint(
            "(verdict in ('scored','bounded')) = (score IS NOT NULL)", name="score_iff_scored"
        ),
    )
    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    candidate_id: Mapped[int] = mapped_column(ForeignKey("candidates.id", ondelete="CASCADE"))
    scorer: Mapped[str] = mapped_column(String(32))
    scorer_version: Mapped[str] = mapped_column(Text)
    verdict: Mapped[str] = mapped_column(String(16))
    score: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)


class ReviewFlag(Base):
    """A region the policy would not accept, or whose text broke a business rule
    (`rule:<name>`, with the offending text in `detail`); back-office staff work these.
    One flag per region and reason, so a region can carry the policy's and a rule's."""

    __tablename__ = "review_flags"
    __table_args__ = (
        UniqueConstraint("region_id", "reason"),
        CheckConstraint("status in ('open','resolved')", name="status"),
    )
    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    region_id: Mapped[int] = mapped_column(ForeignKey("regions.id", ondelete="CASCADE"))
    reason: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="open", index=True)
    resolved_text: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    detail: Mapped[str | None] = mapped_column(Text)
    # A reviewer's claim, so two people do not work one region; it lapses by itself.
    claimed_by: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    claimed_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class User(Base):
    """A back-office account. `tenant` names the documents it sees: one tenant's, `*` for
    every tenant's (explicitly global), None for only documents without a tenant."""

    __tablename__ = "users"
    __table_args__ = (
        UniqueConstraint("name"),
        CheckConstraint("role in ('reviewer','admin')", name="role"),
    )
    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100))
    password_hash: Mapped[str] = mapped_column(Text)
    role: Mapped[str] = mapped_column(String(16))
    tenant: Mapped[str | None] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # A session cookie carries the generation it was issued under; logout, disable and a
    # password change bump it, so every cookie issued before is void at once.
    session_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    disabled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class LoginAttempt(Base):
    """Login attempts under one throttle key (a hash of name, address or both) in the
    current window, counted before the password is checked so parallel guesses cannot
    pass the limit; shared by every review app process on the database."""

    __tablename__ = "login_attempts"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    window_start: Mapped[float] = mapped_column(Float)  # epoch seconds
    count: Mapped[int] = mapped_column(Integer)


class Review(Base):
    """One reviewer action on a region. Rows are only added: the region's final text is
    its latest non-skip review's, and the engine candidates stay as they were."""

    __tablename__ = "reviews"
    __table_args__ = (
        CheckConstraint("action in ('accept','correct','unreadable','skip')", name="action"),
    )
    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    region_id: Mapped[int] = mapped_column(ForeignKey("regions.id", ondelete="CASCADE"), index=True)
    flag_id: Mapped[int | None] = mapped_column(
        ForeignKey("review_flags.id", ondelete="SET NULL"), index=True
    )
    reviewer_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    action: Mapped[str] = mapped_column(String(16))
    engine: Mapped[str | None] = mapped_column(String(32))  # the candidate accepted
    final_text: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # The decision this one replaced (an admin's override); both stay in the history.
    overrides_id: Mapped[int | None] = mapped_column(
        ForeignKey("reviews.id", ondelete="SET NULL")
    )


class ScalingDecision(Base):
    """One scheduler tick for one pool, with every input it decided on: explainable later."""

    __tablename__ = "scaling_decisions"
    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    decided_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, index=True
    )
    role: Mapped[str] = mapped_column(String(16))
    actuator: Mapped[str] = mapped_column(String(32))
    current: Mapped[int] = mapped_column(Integer)
    desired: Mapped[int] = mapped_column(Integer)
    applied: Mapped[bool]
    reason: Mapped[str] = mapped_column(Text)
    inputs: Mapped[dict[str, Any]]


class ApiKey(Base):
    """An HTTP API key of one tenant; only the key's SHA-256 is stored. Its webhook secret
    signs the callbacks of documents submitted with it, so it is kept as is (an HMAC key
    must be at hand to sign; see ocrfleet.api.keys)."""

    __tablename__ = "api_keys"
    __table_args__ = (UniqueConstraint("key_hash"),)
    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    key_hash: Mapped[str] = mapped_column(String(64))
    webhook_secret: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Delivery(Base):
    """One attempt to POST one of a document's webhooks: its completion, or a `reviewed`
    event. `delivery` is the id receivers dedupe on, the body's `delivery`."""

    __tablename__ = "deliveries"
    __table_args__ = (UniqueConstraint("document_id", "delivery", "attempt"),)
    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    document_id: Mapped[int] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"))
    delivery: Mapped[str] = mapped_column(String(64))
    attempt: Mapped[int] = mapped_column(Integer)
    url: Mapped[str] = mapped_column(Text)
    event: Mapped[str] = mapped_column(String(16))
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
