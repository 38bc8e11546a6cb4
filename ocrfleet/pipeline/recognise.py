"""Region OCR stage: the recognisers read the regions' crops. Each engine gets all of a
page's crops in one call and batches them itself (RapidOCR by width bucket).

Failures are contained per crop: an engine that raises on a batch gets that batch again one
crop at a time, and a crop that still fails becomes a Candidate with `error` set. One bad
crop never loses the page, and an error is never mistaken for an empty reading.

Two modes (`OCRFLEET_ENGINE_MODE`): `best_of_n`, every engine reads every region and the
scorer picks; `chain`, each engine reads only the regions every engine before it failed on
(raised, timed out, or read nothing from a crop with ink on it), and the candidate records
why those were skipped. Figures are not read. A table or formula region that an engine
has no mode for is read line by line (`Region.lines`), joined in reading order, and marked
`read_as="lines"` so the review policy can say so.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from PIL import Image, ImageStat

from ocrfleet import ir
from ocrfleet.engines.base import Reading, Recogniser
from ocrfleet.pipeline.regions import crop
from ocrfleet.pipeline.words import approximate, to_page

log = logging.getLogger(__name__)

_MAX_ERROR_CHARS = 500

INK_RANGE = 64  # a crop whose grey levels span less than this has nothing on it to read
READ_AS_LINES = "lines"

# (text, confidence, truncated, words in crop pixels or None) for a crop that was read, or
# the error message for one that was not.
_Read = tuple[str, float | None, bool, list[ir.Word] | None]
_Reading = _Read | str


def recognise(
    page: Image.Image,
    regions: Sequence[ir.Region],
    recognisers: Sequence[Recogniser],
    mode: str = "best_of_n",
    timeout_s: float | None = None,
) -> list[ir.Candidate]:
    """Candidates ordered by region, then recogniser order: one per (region, recogniser) in
    `best_of_n` mode, one per region in `chain` mode; none for figures."""
    if mode not in ("best_of_n", "chain"):
        raise ValueError(f"mode must be best_of_n or chain, got {mode!r}")
    names = [rec.name for rec in recognisers]
    if len(set(names)) != len(names):
        raise ValueError(f"recogniser names must be unique: {names}")
    readable = [region for region in regions if region.category.has_text]
    found: dict[int, list[ir.Candidate]] = {region.number: [] for region in readable}
    pending = list(readable)
    skipped: dict[int, list[str]] = {region.number: [] for region in readable}
    for position, rec in enumerate(recognisers):
        last = position == len(recognisers) - 1
        left = []
        for region, candidate in zip(
            pending, _read_regions(page, pending, rec, timeout_s), strict=True
        ):
            if mode == "best_of_n":
                found[region.number].append(candidate)
                continue
            why = _skip_reason(page, region, candidate)
            if why is None or last:
                found[region.number].append(
                    candidate.model_copy(update={"skipped": skipped[region.number]})
                )
            else:
                skipped[region.number] = [*skipped[region.number], f"{rec.name}: {why}"]
                left.append(region)
        if mode == "chain":
            pending = left
    return [c for region in readable for c in found[region.number]]


def _skip_reason(page: Image.Image, region: ir.Region, candidate: ir.Candidate) -> str | None:
    """Why the next engine in a chain should read this region, or None to keep the reading."""
    if candidate.error is not None:
        return candidate.error
    if not candidate.text.strip() and has_ink(crop(page, region.bbox)):
        return "empty text for a crop with ink"
    return None


def has_ink(image: Image.Image) -> bool:
    low, high = ImageStat.Stat(image.convert("L")).extrema[0]
    return high - low >= INK_RANGE


def _read_regions(
    page: Image.Image,
    regions: Sequence[ir.Region],
    rec: Recogniser,
    timeout_s: float | None,
) -> list[ir.Candidate]:
    """`rec`'s candidate for each region; blocks it has no mode for are read by line."""
    categories = getattr(rec, "categories", frozenset({ir.Category.text}))
    crops: list[Image.Image] = []
    kinds: list[ir.Category] = []
    modes: list[str | None] = []
    spans: list[tuple[int, int]] = []
    for region in regions:
        by_lines = region.category.scored_as not in categories and bool(region.lines)
        boxes = region.lines if by_lines else [region.bbox]
        spans.append((len(crops), len(crops) + len(boxes)))
        crops.extend(crop(page, box) for box in boxes)
        kinds.extend([ir.Category.text if by_lines else region.category.scored_as] * len(boxes))
        modes.append(READ_AS_LINES if by_lines else None)
    readings = _read_all(rec, crops, timeout_s, kinds)
    candidates = []
    for region, (start, end), read_as in zip(regions, spans, modes, strict=True):
        parts = readings[start:end]
        common = {"region_number": region.number, "engine": rec.name, "read_as": read_as}
        errors = [part for part in parts if isinstance(part, str)]
        if errors:
            candidates.append(ir.Candidate(error=errors[0], **common))
            continue
        read = [part for part in parts if not isinstance(part, str)]
        confidences = [part[1] for part in read if part[1] is not None]
        boxes = region.lines if read_as else [region.bbox]
        candidates.append(
            ir.Candidate(
                text="\n".join(p[0] for p in read if p[0]) if read_as else read[0][0],
                confidence=min(confidences) if confidences else None,
                truncated=any(part[2] for part in read),
                words=_words(read, boxes),
                **common,
            )
        )
    return candidates


def _words(read: list[_Read], boxes: Sequence[ir.BBox]) -> list[ir.Word]:
    """The candidate's words in page pixels, numbered by the line of its text they are on:
    the engine's boxes where it gave them, proportional ones where it did not."""
    words: list[ir.Word] = []
    line = 0
    for (text, confidence, _, engine_words), box in zip(read, boxes, strict=True):
        if not text:
            continue
        placed = approximate(text, box, confidence) if engine_words is None else to_page(
            engine_words, box
        )
        words.extend(word.model_copy(update={"line": line + word.line}) for word in placed)
        line += len(text.splitlines()) or 1
    return words


def _read_all(
    rec: Recogniser,
    crops: list[Image.Image],
    timeout_s: float | None = None,
    kinds: list[ir.Category] | None = None,
) -> list[_Reading]:
    """Every crop of the page in one call: the engine batches them itself (RapidOCR by
    width bucket), and slices of the page would split its batches further."""
    if not crops:
        return []
    kinds = kinds or [ir.Category.text] * len(crops)
    try:
        return list(_checked(rec, crops, timeout_s, kinds))
    except EngineTimeout as exc:  # a stuck engine is not asked again crop by crop
        return [_describe(exc)] * len(crops)
    except Exception as exc:  # any engine failure: isolate the crop that causes it
        log.warning(
            "%s failed on a batch of %d crops (%s); retrying one at a time",
            rec.name,
            len(crops),
            _describe(exc),
        )
    readings: list[_Reading] = []
    for one, kind in zip(crops, kinds, strict=True):
        try:
            readings.extend(_checked(rec, [one], timeout_s, [kind]))
        except Exception as one_exc:
            readings.append(_describe(one_exc))
    return readings


class EngineTimeout(TimeoutError):
    pass


def _call(
    rec: Recogniser, batch: list[Image.Image], timeout_s: float | None, kinds: list[ir.Category]
) -> list[object]:
    """`rec.recognise(batch)` (with the crops' categories for an engine that has modes for
    them), given up on after `timeout_s`. The engine's thread cannot be killed: it finishes
    in the background and its result is dropped."""
    args: tuple[object, ...] = (batch, kinds) if hasattr(rec, "categories") else (batch,)
    # An engine with `recognise_words` gives word boxes too; the stage prefers it.
    read = getattr(rec, "recognise_words", rec.recognise)
    if timeout_s is None:
        return list(read(*args))
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ocr-{rec.name}")
    try:
        return list(pool.submit(read, *args).result(timeout=timeout_s))
    except FutureTimeout:
        raise EngineTimeout(f"{rec.name} took longer than {timeout_s:g} s") from None
    finally:
        pool.shutdown(wait=False)


def _checked(
    rec: Recogniser, batch: list[Image.Image], timeout_s: float | None, kinds: list[ir.Category]
) -> list[_Read]:
    """The engine's readings of `batch`, after checking they honour the Recogniser contract:
    (text, confidence) pairs, `engines.base.Reading`s that also say `truncated`, or
    (text, confidence, words) from `recognise_words`."""
    out = _call(rec, batch, timeout_s, kinds)
    if len(out) != len(batch):
        raise RuntimeError(f"{rec.name} returned {len(out)} readings for {len(batch)} crops")
    checked = []
    for item in out:
        text, confidence = item[0], item[1]  # type: ignore[index]
        if not isinstance(text, str):
            raise TypeError(f"{rec.name} returned text of type {type(text).__name__}")
        if confidence is not None and not (math.isfinite(confidence) and 0.0 <= confidence <= 1.0):
            raise ValueError(f"{rec.name} returned confidence {confidence!r} outside [0, 1]")
        truncated = isinstance(item, Reading) and item.truncated
        words = item[2] if not isinstance(item, Reading) and len(item) > 2 else None  # type: ignore[arg-type]
        checked.append(
            (text, None if confidence is None else float(confidence), truncated, words)
        )
    return checked


def _describe(exc: BaseException) -> str:
    message = f"{type(exc).__name__}: {exc}".strip()
    return message[:_MAX_ERROR_CHARS]
