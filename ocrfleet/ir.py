"""The models that flow between stages: the only contract between split, regions,
recognise, score and review. Stages take and return these, never loose dicts."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Category(StrEnum):
    """What a region holds. The scorers and thresholds know three kinds (`scored_as`); the
    other layout classes are read and scored as text but kept apart so headers, footers
    and figures stay visible in the output and the review queue."""

    text = "text"
    formula = "formula"
    table = "table"
    title = "title"
    figure = "figure"
    header = "header"
    footer = "footer"
    reference = "reference"

    @property
    def scored_as(self) -> Category:
        """The Jev contract's category (text, formula or table) this region is judged as."""
        if self in (Category.formula, Category.table):
            return self
        return Category.text

    @property
    def has_text(self) -> bool:
        return self != Category.figure


class Verdict(StrEnum):
    scored = "scored"
    # Not re-read: the candidate's own evidence put it out of its threshold's reach, or the
    # fitted screen predicts it will not be accepted. The score is the upper bound a
    # re-read could lift it to; the region goes to review.
    bounded = "bounded"
    precheck_failed = "precheck_failed"
    render_failed = "render_failed"
    forward_failed = "forward_failed"


SCORING_VERDICTS = frozenset({Verdict.scored, Verdict.bounded})


class DocumentStatus(StrEnum):
    """A document's state; `ocrfleet.states` says which moves are allowed."""

    pending = "pending"
    processing = "processing"
    done = "done"
    partial = "partial"
    rejected = "rejected"
    failed = "failed"
    reviewed = "reviewed"  # done, and every review flag on it closed by a person
    cancelled = "cancelled"


class ReviewAction(StrEnum):
    accept = "accept"  # a candidate is right as it is
    correct = "correct"  # the reviewer typed the text
    unreadable = "unreadable"  # nobody can read it: the final text is empty
    skip = "skip"  # not now; the flag stays open


class PageStatus(StrEnum):
    pending = "pending"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"  # its document was cancelled before the page ran


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BBox(_Model):
    """Pixel box on the page image, half-open: x0 <= x < x1, y0 <= y < y1."""

    x0: int = Field(ge=0)
    y0: int = Field(ge=0)
    x1: int = Field(ge=0)
    y1: int = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> BBox:
        if self.x1 < self.x0 or self.y1 < self.y0:
            raise ValueError(f"bbox corners out of order: {self}")
        return self

    @property
    def width(self) -> int:
        return self.x1 - self.x0

    @property
    def height(self) -> int:
        return self.y1 - self.y0

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.x0, self.y0, self.x1, self.y1)

    def share_inside(self, other: BBox) -> float:
        """The share of this box's area that lies inside `other`."""
        w = min(self.x1, other.x1) - max(self.x0, other.x0)
        h = min(self.y1, other.y1) - max(self.y0, other.y0)
        if w <= 0 or h <= 0:
            return 0.0
        return w * h / max(1, self.width * self.height)


class Document(_Model):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    source_uri: str
    media_type: str
    byte_size: int = Field(ge=0)
    page_count: int = Field(ge=0)


class Page(_Model):
    number: int = Field(ge=1, description="1-based page number within the document")
    width: int = Field(ge=1)
    height: int = Field(ge=1)
    image_uri: str | None = None


class Orientation(_Model):
    """A page's detected orientation: its content turned `angle` degrees clockwise (0, 90,
    180, 270) with this probability; `applied` when the page was turned back upright."""

    angle: int = Field(ge=0, lt=360, multiple_of=90)
    confidence: float = Field(ge=0.0, le=1.0)
    applied: bool


class DetectionPlan(_Model):
    """How the detector covers a page: `whole` in one pass (scaled to its input size), or
    `tiles`: overlapping windows at `scale` plus a whole-page pass, boxes merged."""

    method: str = Field(pattern=r"^(whole|tiles)$")
    scale: float = Field(gt=0.0)
    windows: int = Field(ge=1)


class Region(_Model):
    number: int = Field(ge=1, description="1-based position in reading order on the page")
    category: Category = Category.text
    bbox: BBox
    det_score: float | None = None
    # The layout block the region belongs to (1-based, in reading order); None without layout.
    block: int | None = Field(None, ge=1)
    # Text lines inside a table or formula block, in reading order: what a line engine reads
    # when no engine for the block's category is configured.
    lines: list[BBox] = []


class Word(_Model):
    """One word of a candidate, in page pixels. `line` is its 0-based line within the
    candidate's text; `approximate` marks a box placed by proportional width because the
    engine gave none."""

    text: str
    bbox: BBox
    confidence: float | None = None
    line: int = Field(0, ge=0)
    approximate: bool = False


class TextLine(_Model):
    """One line of a PDF page's own text: its words, with boxes in page pixels."""

    bbox: BBox
    words: list[Word]


class TextLayer(_Model):
    """A PDF page's own text as PDFium reads it (see ocrfleet.pipeline.textlayer):
    `chars` readable characters, `unmapped` more without Unicode, and its lines."""

    chars: int = Field(ge=0)
    unmapped: int = Field(ge=0)
    lines: list[TextLine]


class Candidate(_Model):
    """One engine's reading of one region. `error` set means the engine failed on it."""

    region_number: int = Field(ge=1)
    engine: str
    text: str = ""
    confidence: float | None = None
    error: str | None = None
    # The generation stopped at the token limit, not at its end: the text may be cut short.
    truncated: bool = False
    # A block read line by line (`lines`) by an engine without a mode for its category.
    read_as: str | None = None
    # Engines tried before this one in a fallback chain: "engine: why it was skipped".
    skipped: list[str] = []
    words: list[Word] = []


class Score(_Model):
    """A scorer's judgement of one candidate. Only a `scored` or `bounded` verdict carries
    a score."""

    region_number: int = Field(ge=1)
    engine: str
    scorer: str
    scorer_version: str
    verdict: Verdict
    score: float | None = None
    error: str | None = None

    @model_validator(mode="after")
    def _score_iff_scored(self) -> Score:
        if (self.verdict in SCORING_VERDICTS) != (self.score is not None):
            raise ValueError("a score is present exactly when the verdict is 'scored' or 'bounded'")
        return self


class Decision(_Model):
    """The review policy's outcome for one region. `threshold` is the one the chosen
    candidate was held to (None: no engine chosen, or that kind is uncalibrated)."""

    region_number: int = Field(ge=1)
    chosen_engine: str | None
    accepted: bool
    flag_reason: str | None = None
    threshold: float | None = None

    @model_validator(mode="after")
    def _flag_iff_rejected(self) -> Decision:
        if self.accepted == (self.flag_reason is not None):
            raise ValueError("a region is either accepted or flagged with a reason")
        return self


class Review(_Model):
    """A person's last word on one region (never a skip): its final text and who gave it."""

    region_number: int = Field(ge=1)
    action: ReviewAction
    engine: str | None = None  # the candidate accepted, for `accept`
    text: str
    reviewer: str
    reviewed_at: datetime


class PageResult(_Model):
    """Everything one page produces; persisted in one transaction. `reviews` come only
    from the database: what reviewers decided after the page was processed."""

    page_number: int = Field(ge=1)
    regions: list[Region]
    candidates: list[Candidate]
    scores: list[Score] = []
    decisions: list[Decision] = []
    reviews: list[Review] = []

    def region_text(self, region_number: int) -> str:
        """The region's final text, as the SQL views give it: the review's, else the
        chosen candidate's, else the first candidate by engine name, readings first."""
        for review in self.reviews:
            if review.region_number == region_number:
                return review.text
        own = [c for c in self.candidates if c.region_number == region_number]
        chosen = next(
            (d.chosen_engine for d in self.decisions if d.region_number == region_number), None
        )
        for candidate in own:
            if candidate.engine == chosen:
                return candidate.text
        own.sort(key=lambda c: (c.error is not None, c.engine))
        return own[0].text if own else ""
