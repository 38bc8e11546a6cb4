"""Reproducibility checks: the same input under one run must give byte-identical output, and
two runs' outputs differ only in ways that can be named.

A page's output hash is `service.output_sha256` (the canonical JSON of its regions, texts,
scores and decisions); a document's is the hash of its pages' hashes in page order. When
two outputs differ, each difference is classified by comparing the pages' regions in
reading order: `whitespace`, `punctuation` (full and half width folded, NFKC), `substitution`,
`missing_line` / `extra_line` (a region only in the first / second output), or `structure`
(the same text in a region of another category, layout block or place, or a different page
size, or output that differs only in scores and decisions).
"""

from __future__ import annotations

import difflib
import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ocrfleet import ir

CLASSES = ("whitespace", "punctuation", "substitution", "missing_line", "extra_line", "structure")


@dataclass(frozen=True)
class Difference:
    kind: str
    page: int
    region_a: int | None
    region_b: int | None
    text_a: str | None
    text_b: str | None


@dataclass(frozen=True)
class PageOutput:
    """What the comparison needs of one page: its size, and its result."""

    number: int
    size: tuple[int, int]
    result: ir.PageResult
    sha256: str


def document_sha256(page_hashes: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(page_hashes).encode()).hexdigest()


def region_texts(result: ir.PageResult) -> list[tuple[ir.Region, str]]:
    """Each region with the text the document shows for it (the chosen candidate's, else
    the first readable one's), in reading order."""
    chosen = {d.region_number: d.chosen_engine for d in result.decisions}
    by_region: dict[int, list[ir.Candidate]] = {}
    for candidate in result.candidates:
        by_region.setdefault(candidate.region_number, []).append(candidate)
    out = []
    for region in result.regions:
        own = by_region.get(region.number, [])
        pick = next((c for c in own if c.engine == chosen.get(region.number)), None)
        pick = pick or next((c for c in own if c.error is None), None)
        out.append((region, pick.text if pick is not None else ""))
    return out


def _fold_punctuation(text: str) -> str:
    folded = unicodedata.normalize("NFKC", text)
    return "".join(ch for ch in folded if not unicodedata.category(ch).startswith(("P", "Z")))


def classify_text(a: str, b: str) -> str | None:
    """The class of the difference between two readings of one region; None if equal."""
    if a == b:
        return None
    if re.sub(r"\s+", "", a) == re.sub(r"\s+", "", b):
        return "whitespace"
    if _fold_punctuation(re.sub(r"\s+", "", a)) == _fold_punctuation(re.sub(r"\s+", "", b)):
        return "punctuation"
    return "substitution"


def compare_pages(a: PageOutput, b: PageOutput) -> list[Difference]:
    """The classified differences between two outputs of one page."""
    page = a.number
    out: list[Difference] = []
    if a.size != b.size:
        out.append(Difference("structure", page, None, None, f"{a.size}", f"{b.size}"))
    left, right = region_texts(a.result), region_texts(b.result)
    matcher = difflib.SequenceMatcher(
        a=[text for _, text in left], b=[text for _, text in right], autojunk=False
    )
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        pairs = list(zip(range(i1, i2), range(j1, j2), strict=False))
        for i, j in pairs:
            (ra, ta), (rb, tb) = left[i], right[j]
            kind = classify_text(ta, tb)
            moved = (ra.category, ra.block) != (rb.category, rb.block) or (
                a.size == b.size and ra.bbox != rb.bbox
            )
            if kind is None and moved:
                kind = "structure"
            if kind is not None:
                out.append(Difference(kind, page, ra.number, rb.number, ta, tb))
        for i in range(i1 + len(pairs), i2):
            out.append(Difference("missing_line", page, left[i][0].number, None, left[i][1], None))
        for j in range(j1 + len(pairs), j2):
            region, text = right[j]
            out.append(Difference("extra_line", page, None, region.number, None, text))
        del tag
    return out


def compare_documents(a: Sequence[PageOutput], b: Sequence[PageOutput]) -> list[Difference]:
    out: list[Difference] = []
    pages_b = {page.number: page for page in b}
    for page in a:
        other = pages_b.pop(page.number, None)
        if other is None:
            out.append(Difference("structure", page.number, None, None, "page", None))
        else:
            out.extend(compare_pages(page, other))
    for number in sorted(pages_b):
        out.append(Difference("structure", number, None, None, None, "page"))
    return out


def unexplained(a: Sequence[PageOutput], b: Sequence[PageOutput]) -> list[Difference]:
    """Pages whose hashes differ though no region differs: scores or decisions moved."""
    first = {page.number: page.sha256 for page in a}
    return [
        Difference("structure", page.number, None, None, first.get(page.number), page.sha256)
        for page in b
        if page.number in first and first[page.number] != page.sha256
    ]


def counts(differences: Sequence[Difference]) -> dict[str, int]:
    found = Counter(d.kind for d in differences)
    return {kind: found[kind] for kind in CLASSES if found[kind]}


def config_changes(a: Any, b: Any, prefix: str = "") -> list[str]:
    """`key: old -> new` for every leaf that differs between two run configs."""
    if isinstance(a, dict) and isinstance(b, dict):
        changes = []
        for key in sorted(set(a) | set(b)):
            changes += config_changes(a.get(key), b.get(key), f"{prefix}{key}.")
        return changes
    return [] if a == b else [f"{prefix.rstrip('.')}: {a!r} -> {b!r}"]


def stored_outputs(session: Session, run_id: str) -> dict[str, list[PageOutput]]:
    """Every done page of every document of `run_id`, by document sha256."""
    from ocrfleet.db.models import Document, Page
    from ocrfleet.db.persist import load_page_result

    rows = session.execute(
        select(Document.sha256, Page.id, Page.number, Page.width, Page.height, Page.output_sha256)
        .join(Page, Page.document_id == Document.id)
        .where(Document.run_id == run_id, Page.status == ir.PageStatus.done)
        .order_by(Document.sha256, Page.number)
    ).all()
    out: dict[str, list[PageOutput]] = {}
    for sha256, page_id, number, width, height, output in rows:
        result = load_page_result(session, page_id)
        out.setdefault(sha256, []).append(
            PageOutput(number, (width, height), result, output or "")
        )
    return out
