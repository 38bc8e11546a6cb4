"""Region OCR stage: every recogniser reads every region's crop.

Each engine gets all crops of the page in one call and batches them itself (RapidOCR sorts
them into width buckets, tesseract reads them in one process): handing it slices of the page
would split its batches further.

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

log = logging.getLogger(__name__)

_MAX_ERROR_CHARS = 500

# (text, confidence) for a crop that was read, or the error message for one that was not.
_Reading = tuple[str, float | None] | str


def recognise(
    page: Image.Image,
    regions: Sequence[ir.Region],
    recognisers: Sequence[Recogniser],
) -> list[ir.Candidate]:
    """One Candidate per (region, recogniser), ordered by region, then recogniser order."""
    names = [rec.name for rec in recognisers]
    if len(set(names)) != len(names):
        raise ValueError(f"recogniser names must be unique: {names}")
    crops = [crop(page, region.bbox) for region in regions]
    readings = {rec.name: _read_all(rec, crops) for rec in recognisers}
    candidates = []
    for index, region in enumerate(regions):
        for rec in recognisers:
            reading = readings[rec.name][index]
            if isinstance(reading, str):
                candidates.append(
                    ir.Candidate(region_number=region.number, engine=rec.name, error=reading)
                )
            else:
                text, confidence = reading
                candidates.append(
                    ir.Candidate(
                        region_number=region.number,
                        engine=rec.name,
                        text=text,
                        confidence=confidence,
                    )
                )
    return candidates


def _read_all(rec: Recogniser, crops: list[Image.Image]) -> list[_Reading]:
    if not crops:
        return []
    try:
        return list(_checked(rec, crops))
    except Exception as exc:  # any engine failure: isolate the crop that causes it
        log.warning(
            "%s failed on a batch of %d crops (%s); retrying one at a time",
            rec.name,
            len(crops),
            _describe(exc),
        )
    readings: list[_Reading] = []
    for one in crops:
        try:
            readings.extend(_checked(rec, [one]))
        except Exception as one_exc:
            readings.append(_describe(one_exc))
    return readings


def _checked(rec: Recogniser, batch: list[Image.Image]) -> list[tuple[str, float | None]]:
    """The engine's readings of `batch`, after checking they honour the Recogniser contract."""
    out = list(rec.recognise(batch))
    if len(out) != len(batch):
        raise RuntimeError(f"{rec.name} returned {len(out)} readings for {len(batch)} crops")
    for text, confidence in out:
        if not isinstance(text, str):
            raise TypeError(f"{rec.name} returned text of type {type(text).__name__}")
        if confidence is not None and not (math.isfinite(confidence) and 0.0 <= confidence <= 1.0):
            raise ValueError(f"{rec.name} returned confidence {confidence!r} outside [0, 1]")
    return [(text, None if confidence is None else float(confidence)) for text, confidence in out]


def _describe(exc: BaseException) -> str:
    message = f"{type(exc).__name__}: {exc}".strip()
    return message[:_MAX_ERROR_CHARS]
