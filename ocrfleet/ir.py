"""The models that flow between stages: the only contract between split, regions,
recognise, score and review. Stages take and return these, never loose dicts."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Category(StrEnum):
    text = "text"
    formula = "formula"
    table = "table"


class Verdict(StrEnum):
    scored = "scored"
    precheck_failed = "precheck_failed"
    render_failed = "render_failed"
    forward_failed = "forward_failed"


class DocumentStatus(StrEnum):
    pending = "pending"
    processing = "processing"
    done = "done"
    partial = "partial"
    rejected = "rejected"
    failed = "failed"


class PageStatus(StrEnum):
    pending = "pending"
    done = "done"
    failed = "failed"


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


class Candidate(_Model):
    """One engine's reading of one region. `error` set means the engine failed on it."""

    region_number: int = Field(ge=1)
    engine: str
    text: str = ""
    confidence: float | None = None
    error: str | None = None


class Score(_Model):
    """A scorer's judgement of one candidate. Only `verdict == scored` carries a score."""

    region_number: int = Field(ge=1)
    engine: str
    scorer: str
    scorer_version: str
    verdict: Verdict
    score: float | None = None
    error: str | None = None

    @model_validator(mode="after")
    def _score_iff_scored(self) -> Score:
        if (self.verdict == Verdict.scored) != (self.score is not None):
            raise ValueError("a score is present exactly when the verdict is 'scored'")
        return self


class Decision(_Model):
    """The review policy's outcome for one region."""

    region_number: int = Field(ge=1)
    chosen_engine: str | None
    accepted: bool
    flag_reason: str | None = None

    @model_validator(mode="after")
    def _flag_iff_rejected(self) -> Decision:
        if self.accepted == (self.flag_reason is not None):
            raise ValueError("a region is either accepted or flagged with a reason")
        return self


class PageResult(_Model):
    """Everything one page produces; persisted in one transaction."""

    page_number: int = Field(ge=1)
    regions: list[Region]
    candidates: list[Candidate]
    scores: list[Score] = []
    decisions: list[Decision] = []
