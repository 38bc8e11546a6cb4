"""Where the ink is in a crop: the renderer fits candidates into these bounds so the
rendered image and the original line up."""

from __future__ import annotations

import numpy as np
from PIL import Image

Box = tuple[int, int, int, int]

# A pixel whose grey level differs from the background by more than this is content.
CONTENT_THRESHOLD = 48


def background_level(gray: np.ndarray) -> int:
    """The most common grey level on the crop's border (pages are mostly paper there)."""
    border = np.concatenate([gray[0, :], gray[-1, :], gray[:, 0], gray[:, -1]])
    return int(np.bincount(border, minlength=256).argmax())


def content_bounds(crop: Image.Image) -> Box:
    """Half-open (x0, y0, x1, y1) box of non-background pixels; the whole crop when none."""
    width, height = crop.size
    if width == 0 or height == 0:
        return (0, 0, width, height)
    gray = np.asarray(crop.convert("L"), dtype=np.int16)
    ink = np.abs(gray - background_level(gray.astype(np.uint8))) > CONTENT_THRESHOLD
    rows = np.flatnonzero(ink.any(axis=1))
    cols = np.flatnonzero(ink.any(axis=0))
    if rows.size == 0:
        return (0, 0, width, height)
    return (int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1)
