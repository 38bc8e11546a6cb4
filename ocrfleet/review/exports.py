"""Reviewed regions as fine-tuning rows, in DESIGN.md's formats byte for byte.

`OUT.jsonl` gets the train split and `OUT.eval.jsonl` the eval split, one JSON object a
line (UTF-8, not ASCII-escaped); images are PNG files in `OUT-images/` beside them, named
in the rows relative to the JSONL's folder. The split is by page, from a hash of the input
page (document sha256 and page number): a page is always on one side, in every export.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from ocrfleet.config import Settings
from ocrfleet.review.images import PageImages, region_crop, rendered_candidate
from ocrfleet.review.reviewed import ReviewedRegion
from ocrfleet.scorers.jev import PROMPT_TEMPLATE
from ocrfleet.scorers.render import RenderError

# MiniCPM-OCR's user turn: LLaMA-Factory's "sharegpt" layout and ms-swift's.
SFT_PROMPTS = {"llamafactory": "<image>\nText Recognition:", "ms-swift": "<image>Text Recognition:"}


@dataclass(frozen=True)
class ExportSummary:
    train: int
    eval: int
    pages_train: int
    pages_eval: int
    skipped: int  # regions or candidates with nothing to learn from (see the writers)


def page_position(page_key: str) -> float:
    """Where a page falls in [0, 1): pages below the eval fraction are eval pages."""
    digest = hashlib.sha256(page_key.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def is_eval(page_key: str, eval_fraction: float) -> bool:
    return page_position(page_key) < eval_fraction


def eval_path(out: Path) -> Path:
    return out.with_name(out.stem + ".eval" + out.suffix)


class _Writer:
    def __init__(self, out: Path, eval_fraction: float) -> None:
        self.out = out
        self.eval_fraction = eval_fraction
        self.images = out.with_name(out.stem + "-images")
        self.rows: dict[bool, list[str]] = {False: [], True: []}
        self.pages: dict[bool, set[str]] = {False: set(), True: set()}

    def image(self, image: Image.Image, name: str) -> str:
        self.images.mkdir(parents=True, exist_ok=True)
        image.save(self.images / name, format="PNG")
        return f"{self.images.name}/{name}"

    def add(self, region: ReviewedRegion, row: dict[str, Any]) -> None:
        side = is_eval(region.page_key, self.eval_fraction)
        self.rows[side].append(json.dumps(row, ensure_ascii=False))
        self.pages[side].add(region.page_key)

    def finish(self, skipped: int) -> ExportSummary:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        for side, path in ((False, self.out), (True, eval_path(self.out))):
            path.write_text("".join(line + "\n" for line in self.rows[side]), encoding="utf-8")
        return ExportSummary(
            train=len(self.rows[False]),
            eval=len(self.rows[True]),
            pages_train=len(self.pages[False]),
            pages_eval=len(self.pages[True]),
            skipped=skipped,
        )


def _stem(region: ReviewedRegion) -> str:
    return f"{region.sha256[:16]}-p{region.page_number:04d}-r{region.number:04d}"


def export_ocr_sft(
    regions: Sequence[ReviewedRegion],
    out: Path,
    settings: Settings,
    *,
    eval_fraction: float = 0.1,
    variant: str = "llamafactory",
) -> ExportSummary:
    """One row per region with a final text: the crop and what the reviewer settled on.
    Unreadable regions (no text to learn) are skipped."""
    prompt = SFT_PROMPTS[variant]
    pages = PageImages(settings)
    writer = _Writer(out, eval_fraction)
    skipped = 0
    for region in regions:
        if region.action == "unreadable" or not region.final_text.strip():
            skipped += 1
            continue
        crop = region_crop(pages.get(region.image_uri), region.bbox)
        row = {
            "messages": [
                {"role": "user", "content": prompt},
                {"role": "assistant", "content": region.final_text},
            ],
            "images": [writer.image(crop, _stem(region) + ".png")],
        }
        writer.add(region, row)
    return writer.finish(skipped)


def export_jev(
    regions: Sequence[ReviewedRegion], out: Path, settings: Settings, *, eval_fraction: float = 0.1
) -> ExportSummary:
    """One row per readable candidate of a reviewed region: [crop, rendered], the Jev
    prompt with the candidate, label 1 when it is what the reviewer settled on, else 0.
    The negatives are the engines' real mistakes. Candidates the frozen renderer cannot
    draw (empty text) are skipped, as the scorer skips them."""
    pages = PageImages(settings)
    writer = _Writer(out, eval_fraction)
    skipped = 0
    for region in regions:
        crop = region_crop(pages.get(region.image_uri), region.bbox)
        crop_path: str | None = None
        for reading in region.readings:
            if reading.error is not None:
                skipped += 1
                continue
            try:
                rendered = rendered_candidate(
                    crop, reading.text, region.category, settings.render_font_path
                )
            except RenderError:
                skipped += 1
                continue
            if crop_path is None:
                crop_path = writer.image(crop, _stem(region) + ".png")
            rendered_path = writer.image(rendered, f"{_stem(region)}-{reading.engine}.png")
            row = {
                "messages": [
                    {"role": "user", "content": PROMPT_TEMPLATE.replace("{text}", reading.text)}
                ],
                "images": [crop_path, rendered_path],
                "label": 1 if region.usable(reading) else 0,
            }
            writer.add(region, row)
    return writer.finish(skipped)
