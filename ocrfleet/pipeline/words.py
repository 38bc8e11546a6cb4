"""Word boxes on the page: engines' boxes moved from crop to page pixels, and proportional
boxes for text no engine placed (another engine's reading, a reviewer's correction).

Every output format takes its words from here, so a word's box is always inside its
region's box and its `line` numbers the text's lines in order.
"""

from __future__ import annotations

from collections.abc import Sequence

from ocrfleet import ir


def to_page(words: Sequence[ir.Word], region: ir.BBox) -> list[ir.Word]:
    """Words an engine placed inside a crop of `region`, in page pixels, clipped to it."""
    placed = []
    for word in words:
        box = word.bbox
        x0 = min(max(region.x0 + box.x0, region.x0), region.x1)
        y0 = min(max(region.y0 + box.y0, region.y0), region.y1)
        x1 = min(max(region.x0 + box.x1, x0), region.x1)
        y1 = min(max(region.y0 + box.y1, y0), region.y1)
        placed.append(word.model_copy(update={"bbox": ir.BBox(x0=x0, y0=y0, x1=x1, y1=y1)}))
    return placed


def approximate(text: str, region: ir.BBox, confidence: float | None = None) -> list[ir.Word]:
    """Words of `text` placed by proportional width: each line an equal horizontal band of
    `region`, each word a share of its line's width by character count (a space counts as
    one character). Marked approximate."""
    lines = [line.split() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return []
    words: list[ir.Word] = []
    band = region.height / len(lines)
    for number, line in enumerate(lines):
        y0 = region.y0 + round(number * band)
        y1 = max(region.y0 + round((number + 1) * band), y0)
        chars = sum(len(word) for word in line) + len(line) - 1
        unit = region.width / chars
        offset = 0
        for word in line:
            x0 = region.x0 + round(offset * unit)
            x1 = max(region.x0 + round((offset + len(word)) * unit), x0)
            words.append(
                ir.Word(
                    text=word,
                    bbox=ir.BBox(x0=x0, y0=y0, x1=min(x1, region.x1), y1=min(y1, region.y1)),
                    confidence=confidence,
                    line=number,
                    approximate=True,
                )
            )
            offset += len(word) + 1
    return words


def words_of(candidate: ir.Candidate, region: ir.BBox, text: str | None = None) -> list[ir.Word]:
    """The words to show for `text` (default: the candidate's own): the engine's boxes when
    they spell exactly this text, else proportional boxes."""
    text = candidate.text if text is None else text
    if candidate.words and [w.text for w in candidate.words] == text.split():
        return list(candidate.words)
    return approximate(text, region, candidate.confidence)
