"""Make the bundled example documents, each with its exact text in `<name>.gt.txt`.

Deterministic: the same fonts and library versions give the same bytes. Run from the
repository root:

    python examples/make_examples.py            # (re)write the files in examples/
    python examples/make_examples.py --check    # also OCR them with RapidOCR, print CER

Needs the dev extra (fpdf2) and the DejaVu fonts (Debian: fonts-dejavu-core).
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

HERE = Path(__file__).resolve().parent
FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
SERIF = FONT_DIR / "DejaVuSerif.ttf"
SANS = FONT_DIR / "DejaVuSans.ttf"
SANS_BOLD = FONT_DIR / "DejaVuSans-Bold.ttf"
SEED = 20240312

LETTER = [
    [
        "Northwind Freight Ltd.",
        "14 Harbour Road, Bristol BS1 4QA",
        "12 March 2024",
        "Ms. Clara Jensen",
        "Jensen Hardware Supplies",
        "7 Mill Lane, Leeds LS2 9JT",
        "Dear Ms. Jensen,",
        "Thank you for your order of 4 February. We are pleased to confirm",
        "that all forty-two crates left our Bristol depot on 9 March and",
        "should reach your warehouse by 15 March.",
        "Invoice number 2024-0317 for 1,284.50 GBP is enclosed. Payment is",
        "due within thirty days of delivery.",
    ],
    [
        "Please note that our loading bay will be closed for repairs from",
        "1 to 5 April. Orders placed during that week will be dispatched",
        "on 8 April.",
        "If any crate arrives damaged, keep the packaging and call our",
        "claims desk on 0117 496 0000 within two working days.",
        "Yours sincerely,",
        "Peter Okafor",
        "Customer Accounts Manager",
    ],
]
# Blank space after these lines of the letter (index on its page -> points).
LETTER_GAPS = [{1: 24, 2: 18, 5: 18, 6: 10, 9: 10}, {2: 10, 4: 18, 5: 30}]

SCAN = [
    "NOTICE OF METER READING",
    "Account: 55-10293-7",
    "Reading date: 28 August 2023",
    "Previous reading: 048213",
    "Current reading: 049077",
    "Units used: 864",
    "Please keep this notice for your records.",
]

PHOTO = [
    "Warehouse 3 - Shelf Inventory",
    "Bolts M8 x 40: 350 pcs",
    "Washers M8: 1200 pcs",
    "Hex nuts M8: 410 pcs",
    "Checked by: R. Alvarez",
]

MEMO = [
    [
        "INTERNAL MEMO",
        "To: All site managers",
        "From: Health and Safety Office",
        "Subject: Fire drill schedule",
        "The spring fire drill will take place on",
        "Tuesday 16 April at 10:30.",
    ],
    [
        "Assembly points are unchanged: car park A",
        "for the north building and the front lawn",
        "for the south building.",
        "Report any missing staff to the drill",
        "warden at once.",
    ],
]


def gt_text(pages: list[list[str]]) -> str:
    """Ground truth: a page's lines joined by newline, pages by form feed, no final newline."""
    return "\f".join("\n".join(lines) for lines in pages)


def _font(path: Path, size: int) -> ImageFont.FreeTypeFont:
    if not path.is_file():
        sys.exit(f"font not found: {path} (Debian: apt-get install fonts-dejavu-core)")
    return ImageFont.truetype(str(path), size)


def _draw_lines(
    size: tuple[int, int],
    lines: list[str],
    font: ImageFont.FreeTypeFont,
    origin: tuple[int, int],
    leading: int,
    bold_first: ImageFont.FreeTypeFont | None = None,
) -> Image.Image:
    page = Image.new("L", size, 255)
    draw = ImageDraw.Draw(page)
    x, y = origin
    for number, line in enumerate(lines):
        draw.text((x, y), line, font=bold_first if bold_first and number == 0 else font, fill=0)
        y += leading
    return page


def make_letter() -> bytes:
    """A two-page business letter written by a real PDF writer, with a text layer."""
    from fpdf import FPDF

    pdf = FPDF(format="A4", unit="pt")
    pdf.set_creation_date(dt.datetime(2024, 3, 12, 9, 0, tzinfo=dt.UTC))
    pdf.set_title("Letter to Jensen Hardware Supplies")
    pdf.set_author("Northwind Freight Ltd.")
    pdf.add_font("DejaVuSerif", fname=str(SERIF))
    pdf.set_margins(72, 72, 72)
    pdf.set_auto_page_break(False)
    for lines, gaps in zip(LETTER, LETTER_GAPS, strict=True):
        pdf.add_page()
        pdf.set_font("DejaVuSerif", size=12)
        for number, line in enumerate(lines):
            pdf.cell(text=line, h=18, new_x="LMARGIN", new_y="NEXT")
            pdf.ln(gaps.get(number, 0))
    return bytes(pdf.output())


def make_scan(rng: np.random.Generator) -> bytes:
    """A grey 'scanned' notice: slightly rotated, paper tone, sensor noise, a few specks."""
    big = _draw_lines(
        (2000, 1300), SCAN, _font(SERIF, 56), (160, 150), 140, bold_first=_font(SANS_BOLD, 60)
    )
    page = big.resize((1000, 650), Image.Resampling.LANCZOS)
    page = page.rotate(0.8, resample=Image.Resampling.BICUBIC, fillcolor=255)
    page = page.filter(ImageFilter.GaussianBlur(0.6))
    pixels = np.asarray(page, dtype=np.float64)
    ink = 255.0 - pixels
    paper = 236.0 + 8.0 * np.linspace(-1.0, 1.0, pixels.shape[1])[None, :]
    noisy = paper - ink * (236.0 - 40.0) / 255.0 + rng.normal(0.0, 5.0, pixels.shape)
    specks = rng.random(pixels.shape) < 0.0008
    noisy[specks] = rng.uniform(60.0, 140.0, int(specks.sum()))
    out = Image.fromarray(np.clip(np.rint(noisy), 0, 255).astype(np.uint8))
    buffer = io.BytesIO()
    out.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def make_photo(rng: np.random.Generator) -> bytes:
    """A JPEG stored sideways with EXIF Orientation 6: it reads right only after
    `ImageOps.exif_transpose`."""
    gray = _draw_lines(
        (900, 520), PHOTO, _font(SANS, 34), (70, 70), 80, bold_first=_font(SANS_BOLD, 38)
    )
    gray = gray.filter(ImageFilter.GaussianBlur(0.5))
    ink = (255.0 - np.asarray(gray, dtype=np.float64))[:, :, None] / 255.0
    paper = np.array([246.0, 238.0, 214.0])[None, None, :]
    shade = np.linspace(1.0, 0.88, gray.width)[None, :, None]
    pen = np.array([25.0, 30.0, 70.0])[None, None, :]
    colour = (paper * shade) * (1.0 - ink) + pen * ink + rng.normal(0.0, 3.0, ink.shape)
    upright = Image.fromarray(np.clip(np.rint(colour), 0, 255).astype(np.uint8))
    # Orientation 6 = "rotate 90 degrees clockwise to display", so store it turned anticlockwise.
    stored = upright.transpose(Image.Transpose.ROTATE_90)
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    stored.save(buffer, format="JPEG", quality=88, exif=exif.tobytes(), optimize=True)
    return buffer.getvalue()


def make_memo() -> bytes:
    """A two-page fax-like memo: a multi-frame TIFF of 1-bit CCITT Group 4 pages."""
    font = _font(SERIF, 34)
    frames = [
        _draw_lines((1100, 620), lines, font, (70, 60), 80, bold_first=_font(SANS_BOLD, 38))
        .point(lambda value: 255 if value > 128 else 0)
        .convert("1", dither=Image.Dither.NONE)
        for lines in MEMO
    ]
    buffer = io.BytesIO()
    frames[0].save(
        buffer,
        format="TIFF",
        save_all=True,
        append_images=frames[1:],
        compression="group4",
        dpi=(200, 200),
    )
    return buffer.getvalue()


def build(out_dir: Path) -> dict[str, str]:
    """Write every example and its ground truth into out_dir; returns name -> gt text."""
    rng = np.random.default_rng(SEED)
    made: list[tuple[str, Callable[[], bytes], list[list[str]]]] = [
        ("letter.pdf", make_letter, LETTER),
        ("scan.png", lambda: make_scan(rng), [SCAN]),
        ("photo.jpg", lambda: make_photo(rng), [PHOTO]),
        ("memo.tif", make_memo, MEMO),
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    truths = {}
    for name, make, pages in made:
        (out_dir / name).write_bytes(make())
        truths[name] = gt_text(pages)
        (out_dir / f"{name}.gt.txt").write_text(truths[name], encoding="utf-8")
    return truths


def _edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b))
            )
        previous = current
    return previous[-1]


def cer(hypothesis: str, truth: str) -> float:
    """Character error rate with every run of whitespace (newlines, form feeds) as one space."""
    hyp = re.sub(r"\s+", " ", hypothesis).strip()
    ref = re.sub(r"\s+", " ", truth).strip()
    return _edit_distance(hyp, ref) / max(1, len(ref))


def _reading_order(boxes: np.ndarray, texts: tuple[str, ...]) -> list[str]:
    """RapidOCR's boxes as lines: top to bottom, and left to right within a line."""
    items = []
    for box, text in zip(boxes, texts, strict=True):
        ys, xs = box[:, 1], box[:, 0]
        items.append(((ys.min() + ys.max()) / 2, ys.max() - ys.min(), xs.min(), text))
    items.sort()
    lines: list[list[tuple[float, str]]] = []
    last_y = None
    for centre, height, left, text in items:
        if last_y is None or centre - last_y > height / 2:
            lines.append([])
            last_y = centre
        lines[-1].append((left, text))
    return [" ".join(text for _, text in sorted(line)) for line in lines]


def check(out_dir: Path, truths: dict[str, str]) -> dict[str, float]:
    """OCR each example through the project's loader and RapidOCR; CER per example."""
    from rapidocr import RapidOCR

    from ocrfleet.config import Settings
    from ocrfleet.pipeline.split import iter_pages, open_document

    engine = RapidOCR()
    settings = Settings()
    scores = {}
    for name, truth in truths.items():
        data = (out_dir / name).read_bytes()
        document = open_document(data, settings, source_uri=str(out_dir / name))
        pages = []
        for image in iter_pages(data, settings):
            result = engine(np.asarray(image))
            texts = tuple(result.txts or ())
            boxes = result.boxes if result.boxes is not None else np.zeros((0, 4, 2))
            pages.append("\n".join(_reading_order(np.asarray(boxes), texts)))
        scores[name] = cer("\f".join(pages), truth)
        print(f"{name}: {document.page_count} page(s), CER {scores[name]:.4f}")
        if scores[name] > 0.05:
            print("  OCR read:", "\f".join(pages).replace("\n", " | "))
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write (default: here)")
    parser.add_argument("--check", action="store_true", help="OCR with RapidOCR and print CER")
    args = parser.parse_args()
    truths = build(args.out)
    if args.check:
        sys.exit(1 if max(check(args.out, truths).values()) > 0.05 else 0)


if __name__ == "__main__":
    main()
