"""Where the real third-party documents are, and the page corpus the throughput benches share.

The set lives beside the checkout (`../shared/data/realdocs`); `OCRFLEET_REALDOCS` points
elsewhere when a clone sits somewhere else."""

from __future__ import annotations

import io
import os
from pathlib import Path

from PIL import Image, PngImagePlugin

from ocrfleet.config import Settings
from ocrfleet.pipeline.images import encode_png
from ocrfleet.pipeline.split import iter_pages

REPO = Path(__file__).resolve().parents[1]


def find_realdocs() -> Path:
    candidates = [REPO.parent / "shared" / "data" / "realdocs", Path("/work/shared/data/realdocs")]
    if "OCRFLEET_REALDOCS" in os.environ:
        candidates.insert(0, Path(os.environ["OCRFLEET_REALDOCS"]))
    return next((path for path in candidates if path.is_dir()), candidates[0])


REALDOCS = find_realdocs()


def real_pages(settings: Settings, limit: int) -> list[bytes]:
    """Real pages (UNLV scans, phototest, eurotext, then olmOCR-bench PDF pages) as PNGs."""
    sources = sorted((REALDOCS / "tesseract_test").glob("*.tif")) + sorted(
        (REALDOCS / "olmocr_bench_sample" / "pdfs").glob("*.pdf")
    )
    pages: list[bytes] = []
    for source in sources:
        for image in iter_pages(source.read_bytes(), settings):
            pages.append(encode_png(image))
            if len(pages) == limit:
                return pages
    return pages


def tagged_png(data: bytes, tag: str) -> bytes:
    """The same pixels with a text chunk, so each input has its own sha256 (no dedup)."""
    info = PngImagePlugin.PngInfo()
    info.add_text("bench", tag)
    out = io.BytesIO()
    Image.open(io.BytesIO(data)).save(out, format="PNG", pnginfo=info, compress_level=1)
    return out.getvalue()
