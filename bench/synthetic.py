"""Synthetic scanned text lines with known truth, and rule perturbations of that truth.

Training data for the consensus scorer comes only from here (never from the realdocs set
the benchmark evaluates on). Lines are drawn with several fonts that are not the frozen
renderer's font, then degraded the way scans are (blur, noise, lost resolution,
binarisation, thickening or thinning of strokes, slight rotation), so the engines make real
mistakes on them. Everything is seeded: the same seed gives the same pixels.

Text comes from the Debian licence texts in /usr/share/common-licenses (plain English
prose, identical on every Debian machine), reshuffled into sentences, plus generated lines
dense in digits (dates, amounts, references, table-like rows).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import matplotlib
import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from ocrfleet import ir

LICENCES = Path("/usr/share/common-licenses")
_MPL_FONTS = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
_DEJAVU = Path("/usr/share/fonts/truetype/dejavu")
# Serif and sans faces unlike the renderer's Noto Sans CJK. STIX is a Times clone, the
# commonest face in scanned books and papers.
FONTS = (
    _MPL_FONTS / "STIXGeneral.ttf",
    _MPL_FONTS / "STIXGeneral.ttf",
    _MPL_FONTS / "STIXGeneralItalic.ttf",
    _MPL_FONTS / "STIXGeneralBol.ttf",
    _DEJAVU / "DejaVuSerif.ttf",
    _DEJAVU / "DejaVuSerifCondensed.ttf",
    _DEJAVU / "DejaVuSans.ttf",
    _DEJAVU / "DejaVuSansCondensed.ttf",
    _DEJAVU / "DejaVuSans-Bold.ttf",
    _DEJAVU / "DejaVuSansMono.ttf",
)


@dataclass(frozen=True)
class SynthLine:
    image: Image.Image
    truth: str
    category: ir.Category
    style: str  # font and degradations, for looking at failures


@lru_cache(maxsize=1)
def _corpus() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(sentences, vocabulary) from the licence texts, in a fixed order."""
    files = sorted({path.resolve() for path in LICENCES.iterdir() if path.is_file()})
    if not files:
        raise FileNotFoundError(f"no licence texts under {LICENCES} for the synthetic corpus")
    text = " ".join(path.read_text(encoding="utf-8", errors="replace") for path in files)
    text = " ".join(text.split())
    sentences = tuple(s for s in re.split(r"(?<=[.;:])\s+", text) if len(s) >= 20 and s.isascii())
    words = sorted({w.strip("\"'()[],.;:") for w in text.split()})
    vocabulary = tuple(w for w in words if w.isalpha() and w.isascii() and 2 <= len(w) <= 14)
    return sentences, vocabulary


def _prose_line(rng: random.Random) -> str:
    sentences, _ = _corpus()
    sentence = rng.choice(sentences)
    words = sentence.split()
    length = rng.randint(3, 14)
    start = rng.randint(0, max(0, len(words) - length))
    return " ".join(words[start : start + length])


def _shuffled_line(rng: random.Random) -> str:
    """Words from the vocabulary with the punctuation and casing of real text."""
    _, vocabulary = _corpus()
    words = [rng.choice(vocabulary).lower() for _ in range(rng.randint(3, 11))]
    if rng.random() < 0.5:
        words[0] = words[0].capitalize()
    for i in range(1, len(words)):
        roll = rng.random()
        if roll < 0.08:
            words[i - 1] += ","
        elif roll < 0.12:
            words[i - 1] += "."
            words[i] = words[i].capitalize()
        elif roll < 0.14:
            words[i] = words[i].capitalize()
        elif roll < 0.16:
            words[i] = f"({words[i]})"
        elif roll < 0.18:
            words[i] = f'"{words[i]}"'
        elif roll < 0.20:
            words[i] += "'s"
        elif roll < 0.22:
            words[i] += "-" + rng.choice(vocabulary).lower()
    if rng.random() < 0.15:
        words[-1] += "-"  # hyphenated line end
    elif rng.random() < 0.5:
        words[-1] += rng.choice(".,;:")
    return " ".join(words)


_MONTHS = ("Jan.", "Feb.", "March", "April", "May", "June", "July", "Aug.", "Sept.", "Oct.")


def _digit_line(rng: random.Random) -> str:
    _, vocabulary = _corpus()
    word = rng.choice(vocabulary).capitalize()
    kind = rng.randrange(6)
    if kind == 0:
        return (
            f"{word}, vol. {rng.randint(1, 120)}, pp. {rng.randint(1, 900)}-"
            f"{rng.randint(1, 999)}, {rng.choice(_MONTHS)} {rng.randint(1950, 2024)}."
        )
    if kind == 1:
        return f"{word} ${rng.randint(1, 99_999):,}.{rng.randint(0, 99):02d} {rng.randint(1, 99)}%"
    if kind == 2:
        return f"Tel. ({rng.randint(200, 999)}) {rng.randint(200, 999)}-{rng.randint(0, 9999):04d}"
    if kind == 3:
        cells = [str(rng.randint(0, 9999)) for _ in range(rng.randint(3, 6))]
        return f"{word} " + " ".join(cells)
    if kind == 4:
        return (
            f"{rng.randint(1, 31)} {rng.choice(_MONTHS)} {rng.randint(1900, 2030)}, "
            f"No. {rng.randint(1, 999)}"
        )
    return (
        f"[{rng.randint(1, 60)}] {word} {rng.choice(vocabulary)}, "
        f"{rng.randint(1, 99)}({rng.randint(1, 12)}), {rng.randint(1970, 2024)}."
    )


def random_text(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.45:
        return _prose_line(rng)
    if roll < 0.8:
        return _shuffled_line(rng)
    return _digit_line(rng)


def _draw_line(text: str, font_path: Path, size: int, rng: random.Random) -> Image.Image:
    font = ImageFont.truetype(str(font_path), size=size, layout_engine=ImageFont.Layout.BASIC)
    x0, y0, x1, y1 = font.getbbox(text, anchor="ls")
    ascent, descent = font.getmetrics()
    pad_x = rng.randint(2, max(3, size // 2))
    pad_y = rng.randint(1, max(2, size // 5))
    width = (x1 - x0) + 2 * pad_x
    height = ascent + descent + 2 * pad_y
    image = Image.new("L", (max(width, 4), max(height, 4)), 255)
    ImageDraw.Draw(image).text((pad_x - x0, pad_y + ascent), text, font=font, fill=0, anchor="ls")
    return image


def _degrade(
    image: Image.Image, size: int, rng: random.Random, np_rng: np.random.Generator
) -> tuple[Image.Image, str]:
    """Scan-like damage; the text never ends up smaller than about 11 px a em."""
    steps = []
    if rng.random() < 0.3:
        angle = rng.uniform(-0.8, 0.8)
        image = image.rotate(angle, resample=Image.Resampling.BILINEAR, expand=True, fillcolor=255)
        steps.append(f"rot{angle:.1f}")
    if rng.random() < 0.5:
        scale = rng.uniform(min(0.8, max(0.35, 11 / size)), 0.85)
        small = image.resize(
            (max(4, round(image.width * scale)), max(4, round(image.height * scale))),
            Image.Resampling.BILINEAR,
        )
        image = small.resize(image.size, Image.Resampling.BILINEAR) if rng.random() < 0.5 else small
        steps.append(f"res{scale:.2f}")
    if rng.random() < 0.4:
        radius = rng.uniform(0.3, 1.4)
        image = image.filter(ImageFilter.GaussianBlur(radius))
        steps.append(f"blur{radius:.1f}")
    if rng.random() < 0.25:
        image = image.filter(
            ImageFilter.MinFilter(3) if rng.random() < 0.5 else ImageFilter.MaxFilter(3)
        )
        steps.append("stroke")
    pixels = np.asarray(image, dtype=np.float64)
    if rng.random() < 0.5:
        sigma = rng.uniform(4, 40)
        pixels = pixels + np_rng.normal(0.0, sigma, pixels.shape)
        steps.append(f"noise{sigma:.0f}")
    if rng.random() < 0.35:
        level = rng.uniform(110, 170)
        pixels = np.where(pixels < level, 0.0, 255.0)
        if rng.random() < 0.5:  # salt and pepper of a poor 1-bit scan
            flips = np_rng.random(pixels.shape) < rng.uniform(0.001, 0.01)
            pixels = np.where(flips, 255.0 - pixels, pixels)
        steps.append(f"bin{level:.0f}")
    elif rng.random() < 0.3:
        paper, ink = rng.uniform(200, 250), rng.uniform(0, 90)
        pixels = ink + (paper - ink) * pixels / 255.0
        steps.append("contrast")
    out = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).convert("RGB")
    return out, "+".join(steps) or "clean"


def synthetic_lines(n: int, seed: int) -> list[SynthLine]:
    """`n` degraded single text lines; the same (n, seed) gives the same lines."""
    rng = random.Random(seed)
    np_rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        text = random_text(rng)
        font = rng.choice(FONTS)
        size = rng.randint(16, 48)
        image, steps = _degrade(_draw_line(text, font, size, rng), size, rng, np_rng)
        lines.append(SynthLine(image, text, ir.Category.text, f"{font.stem}/{size}px/{steps}"))
    return lines


# ---- rule perturbations: plausible OCR errors applied to the truth -----------------------

_LOOKALIKE = {
    "l": "1I|",
    "1": "lI7",
    "I": "l1",
    "O": "0D",
    "0": "OoD",
    "o": "0ce",
    "e": "co",
    "c": "e",
    "rn": "m",
    "m": "rn",
    "S": "5$",
    "5": "S6",
    "B": "8",
    "8": "B3",
    "g": "q9",
    "a": "o",
    "i": "l",
    "t": "f",
    "f": "t",
    "h": "b",
    "u": "n",
    "n": "u",
    ",": ".",
    ".": ",",
    ";": ":",
    "'": "’",
    '"': "“”",
    "-": "–",
    "2": "Z",
    "6": "b5",
    "9": "g",
}


def _change_digit(text: str, rng: random.Random) -> str | None:
    places = [i for i, ch in enumerate(text) if ch.isdigit()]
    if not places:
        return None
    i = rng.choice(places)
    new = rng.choice([d for d in "0123456789" if d != text[i]])
    return text[:i] + new + text[i + 1 :]


def _lookalike(text: str, rng: random.Random) -> str | None:
    places = [(i, k) for k in _LOOKALIKE for i in range(len(text)) if text.startswith(k, i)]
    if not places:
        return None
    i, key = rng.choice(places)
    return text[:i] + rng.choice(_LOOKALIKE[key]) + text[i + len(key) :]


def _drop_char(text: str, rng: random.Random) -> str | None:
    places = [i for i, ch in enumerate(text) if not ch.isspace()]
    if len(places) < 2:
        return None
    i = rng.choice(places)
    return text[:i] + text[i + 1 :]


def _swap_chars(text: str, rng: random.Random) -> str | None:
    places = [
        i for i in range(len(text) - 1) if text[i] != text[i + 1] and not text[i : i + 2].isspace()
    ]
    if not places:
        return None
    i = rng.choice(places)
    return text[:i] + text[i + 1] + text[i] + text[i + 2 :]


def _merge_words(text: str, rng: random.Random) -> str | None:
    places = [i for i, ch in enumerate(text) if ch == " "]
    if not places:
        return None
    i = rng.choice(places)
    return text[:i] + text[i + 1 :]


def _split_word(text: str, rng: random.Random) -> str | None:
    places = [i for i in range(1, len(text)) if text[i - 1].isalpha() and text[i].isalpha()]
    if not places:
        return None
    i = rng.choice(places)
    return text[:i] + " " + text[i:]


def _drop_word(text: str, rng: random.Random) -> str | None:
    words = text.split(" ")
    if len(words) < 3:
        return None
    del words[rng.randrange(len(words))]
    return " ".join(words)


def _insert_char(text: str, rng: random.Random) -> str | None:
    i = rng.randrange(len(text) + 1)
    return text[:i] + rng.choice(".,'-il1|") + text[i:]


def _truncate(text: str, rng: random.Random) -> str | None:
    if len(text) < 8:
        return None
    return text[: rng.randint(len(text) // 2, len(text) - 2)].rstrip()


def _case_flip(text: str, rng: random.Random) -> str | None:
    places = [i for i, ch in enumerate(text) if ch.isalpha() and ch.swapcase() != ch]
    if not places:
        return None
    i = rng.choice(places)
    return text[:i] + text[i].swapcase() + text[i + 1 :]


PERTURBATIONS = {
    "change_digit": _change_digit,
    "lookalike": _lookalike,
    "drop_char": _drop_char,
    "swap_chars": _swap_chars,
    "merge_words": _merge_words,
    "split_word": _split_word,
    "drop_word": _drop_word,
    "insert_char": _insert_char,
    "truncate": _truncate,
    "case_flip": _case_flip,
}


def perturb(text: str, rng: random.Random) -> tuple[str, str] | None:
    """(rule name, changed text) for one rule that applies and changes the text."""
    names = list(PERTURBATIONS)
    rng.shuffle(names)
    for name in names:
        changed = PERTURBATIONS[name](text, rng)
        if changed is not None and " ".join(changed.split()) != " ".join(text.split()):
            return name, changed
    return None


# ---- tables ---------------------------------------------------------------------------


def _table_rows(rng: random.Random) -> list[list[str]]:
    _, vocabulary = _corpus()
    n_rows, n_cols = rng.randint(2, 4), rng.randint(2, 4)
    rows = [[rng.choice(vocabulary).capitalize() for _ in range(n_cols)]]
    for _ in range(n_rows - 1):
        rows.append(
            [rng.choice(vocabulary)] + [str(rng.randint(0, 9999)) for _ in range(n_cols - 1)]
        )
    return rows


def table_html(rows: list[list[str]]) -> str:
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table>{body}</table>"


def _draw_table(rows: list[list[str]], font_path: Path, size: int) -> Image.Image:
    font = ImageFont.truetype(str(font_path), size=size, layout_engine=ImageFont.Layout.BASIC)
    pad = size // 2
    n_cols = len(rows[0])
    widths = [max(round(font.getlength(row[c])) for row in rows) + 2 * pad for c in range(n_cols)]
    row_h = round(size * 1.3) + 2 * pad // 2
    image = Image.new("L", (sum(widths) + 3, row_h * len(rows) + 3), 255)
    draw = ImageDraw.Draw(image)
    y = 1
    for row in rows:
        x = 1
        for c, cell in enumerate(row):
            draw.rectangle((x, y, x + widths[c], y + row_h), outline=0)
            draw.text((x + pad, y + row_h // 2), cell, font=font, fill=0, anchor="lm")
            x += widths[c]
        y += row_h
    return image


def break_cells(rows: list[list[str]], rng: random.Random) -> list[list[str]]:
    """A broken table: two cells merged, a cell lost, or a value moved to the wrong cell."""
    rows = [list(row) for row in rows]
    r = rng.randrange(len(rows))
    row = rows[r]
    kind = rng.randrange(3)
    if kind == 0 and len(row) > 1:
        c = rng.randrange(len(row) - 1)
        row[c : c + 2] = [f"{row[c]} {row[c + 1]}"]
    elif kind == 1 and len(row) > 1:
        del row[rng.randrange(len(row))]
    else:
        other = (r + 1) % len(rows)
        c = rng.randrange(min(len(row), len(rows[other])))
        row[c], rows[other][c] = rows[other][c], row[c]
        if row == rows[other]:
            row.append("")
    return rows


def synthetic_tables(n: int, seed: int) -> list[tuple[SynthLine, str]]:
    """(table image with its HTML truth, a broken-cells version of the HTML) pairs."""
    rng = random.Random(seed)
    np_rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        rows = _table_rows(rng)
        font = rng.choice(FONTS)
        size = rng.randint(16, 32)
        image, steps = _degrade(_draw_table(rows, font, size), size, rng, np_rng)
        truth = table_html(rows)
        broken = table_html(break_cells(rows, rng))
        out.append(
            (SynthLine(image, truth, ir.Category.table, f"table/{font.stem}/{steps}"), broken)
        )
    return out
