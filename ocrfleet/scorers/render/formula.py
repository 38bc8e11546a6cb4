"""Formulas given as LaTeX, drawn with matplotlib's mathtext (no TeX installation needed)."""

from __future__ import annotations

import re
import threading
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from ocrfleet.scorers.render.bounds import Box
from ocrfleet.scorers.render.errors import RenderError

if TYPE_CHECKING:
    from matplotlib.mathtext import MathTextParser

# Formula size (pt = px at 72 dpi) of the measuring pass; the drawing pass scales from it.
MEASURE_SIZE = 48.0
MATH_FONTFAMILY = "cm"
# Delimiters an engine may wrap around the LaTeX; mathtext wants bare `$...$`.
_DELIMITERS = [
    re.compile(r"^\$\$(.*)\$\$$", re.S),
    re.compile(r"^\$(.*)\$$", re.S),
    re.compile(r"^\\\[(.*)\\\]$", re.S),
    re.compile(r"^\\\((.*)\\\)$", re.S),
    re.compile(r"^\\begin\{(equation\*?|displaymath)\}(.*)\\end\{\1\}$", re.S),
]
# Commands mathtext lacks that only change spacing or size: dropped.
_DROP = re.compile(r"\\(displaystyle|textstyle|scriptstyle|nonumber|notag)\b")
# rcParams that change mathtext's raster output, pinned to matplotlib's own defaults so a
# site matplotlibrc cannot change the pixels. rcParams are global: hence the lock.
_PINNED_KEYS = (
    "text.hinting",
    "text.hinting_factor",
    "text.antialiased",
    "mathtext.fallback",
    "mathtext.default",
    "mathtext.fontset",
)
_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _parser() -> MathTextParser:
    """matplotlib is imported on the first formula: it adds ~18 MB to every worker that
    never draws one."""
    from matplotlib.mathtext import MathTextParser

    return MathTextParser("agg")


def latex_body(text: str) -> str:
    """The LaTeX without its outer delimiters or spacing-only commands."""
    body = text.strip()
    for pattern in _DELIMITERS:
        match = pattern.match(body)
        if match:
            body = match.group(match.lastindex or 1).strip()
            break
    body = _DROP.sub("", body)
    body = " ".join(body.split())
    if not body:
        raise RenderError("formula: empty LaTeX")
    if "$" in body.replace(r"\$", ""):
        raise RenderError("formula: unescaped $ inside the formula")
    return body


def _raster(body: str, size: float) -> np.ndarray:
    """Coverage (0 = paper, 255 = ink) of the formula at `size` px."""
    import matplotlib
    from matplotlib.font_manager import FontProperties

    parser = _parser()
    prop = FontProperties(size=size, math_fontfamily=MATH_FONTFAMILY)
    pinned = {key: matplotlib.rcParamsDefault[key] for key in _PINNED_KEYS}
    with _LOCK, matplotlib.rc_context(pinned):
        try:
            parsed = parser.parse(f"${body}$", dpi=72, prop=prop, antialiased=True)
        except Exception as error:  # mathtext raises ValueError, and worse on odd input
            reason = str(error).strip().splitlines()
            raise RenderError(
                f"formula: mathtext cannot parse it: {reason[-1] if reason else error!r}"
            ) from error
    return np.asarray(parsed.image, dtype=np.uint8)


def _ink_box(coverage: np.ndarray) -> np.ndarray:
    rows = np.flatnonzero(coverage.any(axis=1))
    cols = np.flatnonzero(coverage.any(axis=0))
    if rows.size == 0:
        raise RenderError("formula: renders to nothing")
    return coverage[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]


def render_formula(text: str, canvas: Image.Image, box: Box) -> None:
    body = latex_body(text)
    x0, y0, x1, y1 = box
    width, height = x1 - x0, y1 - y0
    measured = _ink_box(_raster(body, MEASURE_SIZE))
    size = max(1.0, MEASURE_SIZE * min(width / measured.shape[1], height / measured.shape[0]))
    ink = _ink_box(_raster(body, size))
    for _ in range(20):  # rounding can overshoot the box by a pixel or two
        if ink.shape[0] <= height and ink.shape[1] <= width:
            break
        size *= 0.95
        ink = _ink_box(_raster(body, size))
    ink = ink[:height, :width]
    # Centred in the content box, black on the white canvas.
    left = x0 + (width - ink.shape[1]) // 2
    top = y0 + (height - ink.shape[0]) // 2
    patch = Image.fromarray(np.ascontiguousarray(255 - ink))
    canvas.paste(patch, (left, top))
