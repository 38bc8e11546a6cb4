"""Region OCR stage: every recogniser reads every region's crop, in batches.

Failures are contained per crop: an engine that raises on a batch gets that batch again one
crop at a time, and a crop that still fails becomes a Candidate with `error` set. One bad
crop never loses the page, and an error is never mistaken for an empty reading.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from PIL import Image

from ocrfleet import ir
from ocrfleet.engines.base import Recogniser
from ocrfleet.pipeline.regions import crop
from ocrfleet.pipeline.words import approximate, to_page

log = logging.getLogger(__name__)

_MAX_ERROR_CHARS = 500

# (text, confidence, words in crop pixels or None) for a crop that was read, or the error
# message for one that was not.
_Read = tuple[str, float | None, list[ir.Word] | None]
_Reading = _Read | str


def recognise(
    page: Image.Image,
    regions: Sequence[ir.Region],
    recognisers: Sequence[Recogniser],
    batch_size: int,
) -> list[ir.Candidate]:
    """One Candidate per (region, recogniser), ordered by region, then recogniser order."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    names = [rec.name for rec in recognisers]
    if len(set(names)) != len(names):
        raise ValueError(f"recogniser names must be unique: {names}")
    crops = [crop(page, region.bbox) for region in regions]
    readings = {rec.name: _read_all(rec, crops, batch_size) for rec in recognisers}
    candidates = []
    for index, region in enumerate(regions):
        for rec in recognisers:
            reading = readings[rec.name][index]
            if isinstance(reading, str):
                candidates.append(
                    ir.Candidate(region_number=region.number, engine=rec.name, error=reading)
                )
            else:
                text, confidence, words = reading
                candidates.append(
                    ir.Candidate(
                        region_number=region.number,
                        engine=rec.name,
                        text=text,
                        confidence=confidence,
                        words=approximate(text, region.bbox, confidence)
                        if words is None
                        else to_page(words, region.bbox),
                    )
                )
    return candidates


def _read_all(rec: Recogniser, crops: list[Image.Image], batch_size: int) -> list[_Reading]:
    readings: list[_Reading] = []
    for start in range(0, len(crops), batch_size):
        batch = crops[start : start + batch_size]
        try:
            readings.extend(_checked(rec, batch))
        except Exception as exc:  # any engine failure: isolate the crop that causes it
            log.warning(
                "%s failed on a batch of %d crops (%s); retrying one at a time",
                rec.name,
                len(batch),
                _describe(exc),
            )
            for one in batch:
                try:
                    readings.extend(_checked(rec, [one]))
                except Exception as one_exc:
                    readings.append(_describe(one_exc))
    return readings


def _checked(rec: Recogniser, batch: list[Image.Image]) -> list[_Read]:
    """The engine's readings of `batch`, after checking they honour the Recogniser contract.
    An engine with `recognise_words` gives word boxes too; for others they are None."""
    read_words = getattr(rec, "recognise_words", None)
    out = list(read_words(batch) if read_words is not None else rec.recognise(batch))
    if len(out) != len(batch):
        raise RuntimeError(f"{rec.name} returned {len(out)} readings for {len(batch)} crops")
    readings: list[_Read] = []
    for text, confidence, *rest in out:
        if not isinstance(text, str):
            raise TypeError(f"{rec.name} returned text of type {type(text).__name__}")
        if confidence is not None and not (math.isfinite(confidence) and 0.0 <= confidence <= 1.0):
            raise ValueError(f"{rec.name} returned confidence {confidence!r} outside [0, 1]")
        words = rest[0] if rest else None
        readings.append((text, None if confidence is None else float(confidence), words))
    return readings


def _describe(exc: BaseException) -> str:
    message = f"{type(exc).__name__}: {exc}".strip()
    return message[:_MAX_ERROR_CHARS]
