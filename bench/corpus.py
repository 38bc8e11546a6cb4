"""Where the real third-party documents are, the page corpus the throughput benches share,
and the one word recall against ground truth the speed benches report.

The set lives beside the checkout (`../shared/data/realdocs`); `OCRFLEET_REALDOCS` points
elsewhere when a clone sits somewhere else. Receipts come from the training set beside it
(`../shared/data/train/sroie`)."""

from __future__ import annotations

import io
import json
import os
import string
import unicodedata
from collections import Counter
from pathlib import Path

from PIL import Image, PngImagePlugin

from ocrfleet.config import Settings
from ocrfleet.pipeline.images import encode_png, load_image
from ocrfleet.pipeline.split import iter_pages

REPO = Path(__file__).resolve().parents[1]


def find_realdocs() -> Path:
    candidates = [REPO.parent / "shared" / "data" / "realdocs", Path("/work/shared/data/realdocs")]
    if "OCRFLEET_REALDOCS" in os.environ:
        candidates.insert(0, Path(os.environ["OCRFLEET_REALDOCS"]))
    return next((path for path in candidates if path.is_dir()), candidates[0])


REALDOCS = find_realdocs()
SROIE = REALDOCS.parent / "train" / "sroie"
OLMOCR = REALDOCS / "olmocr_bench_sample"
_EDGES = string.punctuation + "‘’“”«»–—…·•°©®™"


def words(text: str) -> Counter[str]:
    """The words of `text` as a multiset: NFKC, case-folded (receipt transcripts are upper
    case where the print is not), punctuation stripped from both ends, empty ones dropped."""
    found = (w.strip(_EDGES) for w in unicodedata.normalize("NFKC", text).casefold().split())
    return Counter(w for w in found if w)


def word_recall(text: str, truth: str) -> tuple[int, int]:
    """(words of `truth` found in `text`, words of `truth`), both counted as multisets, so
    reading order does not count and a set's recall is the ratio of the sums."""
    wanted = words(truth)
    return sum((words(text) & wanted).values()), sum(wanted.values())


def receipt_images(count: int) -> list[Path]:
    """`count` SROIE receipts spread evenly over the set."""
    images = sorted((SROIE / "images").glob("*.jpg"))
    step = max(1.0, len(images) / max(1, count))
    return [images[int(i * step)] for i in range(min(count, len(images)))]


def receipt_lines(receipt: str) -> list[tuple[tuple[int, int, int, int], str, int]]:
    """(box, transcript, row number in box/<id>.csv) per transcribed line of a receipt: each
    row holds a quadrilateral's 8 coordinates, then the text; the box bounds the
    quadrilateral, clipped at the page's top and left edge."""
    rows = (SROIE / "box" / f"{receipt}.csv").read_text(encoding="utf-8", errors="replace")
    lines = []
    for n, row in enumerate(rows.splitlines()):
        parts = row.split(",", 8)
        if len(parts) < 9 or not parts[8].strip():
            continue
        xs, ys = [int(v) for v in parts[0:8:2]], [int(v) for v in parts[1:8:2]]
        lines.append(((max(0, min(xs)), max(0, min(ys)), max(xs), max(ys)), parts[8].strip(), n))
    return lines


def receipt_truth(image: Path) -> str:
    """A receipt's transcript lines."""
    return "\n".join(text for _, text, _ in receipt_lines(image.stem))


def receipt_crops(images: list[Path]) -> tuple[list[Image.Image], list[str]]:
    """The line crops of receipts cut at their transcript boxes, with the transcripts; boxes
    of 4 px or less either way (slivers) are left out."""
    crops, truths = [], []
    for image in images:
        page = load_image(image.read_bytes())
        for (left, top, right, bottom), text, _ in receipt_lines(image.stem):
            if right - left > 4 and bottom - top > 4:
                crops.append(page.crop((left, top, right, bottom)))
                truths.append(text)
    return crops, truths


def olmocr_truth() -> dict[tuple[str, int], str]:
    """(PDF path under pdfs/, page) -> the text of the page's olmOCR-bench `present` checks:
    the only ground truth the sample has (snippets the page must contain)."""
    truth: dict[tuple[str, int], list[str]] = {}
    for line in (OLMOCR / "dataset.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            check = json.loads(line)
            if check["type"] == "present":
                truth.setdefault((check["pdf"], int(check["page"])), []).append(check["text"])
    return {key: "\n".join(texts) for key, texts in truth.items()}


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
