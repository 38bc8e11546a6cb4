"""The frozen candidate renderer: candidate text drawn the way the Jev model was shown it.

`render(text, category, size, content_box)` gives a white RGB image of the crop's size with
the candidate fitted into the crop's content bounds (`content_bounds(crop)`): plain text,
an HTML table as a grid, or LaTeX through matplotlib's mathtext. Same input, same pixels.
A candidate that cannot be drawn raises `RenderError`; a missing font `FontNotFoundError`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from PIL import Image

from ocrfleet import ir
from ocrfleet.scorers.render.bounds import Box, content_bounds
from ocrfleet.scorers.render.errors import FontNotFoundError, RenderError
from ocrfleet.scorers.render.fonts import resolve_font_path
from ocrfleet.scorers.render.formula import render_formula
from ocrfleet.scorers.render.table import render_table
from ocrfleet.scorers.render.text import render_text
from ocrfleet.scorers.render.version import RENDERER_MANUAL_VERSION, renderer_version

__all__ = [
    "RENDERER_MANUAL_VERSION",
    "RENDERER_VERSION",
    "Box",
    "FontNotFoundError",
    "RenderError",
    "content_bounds",
    "render",
    "renderer_version",
]

# FreeType faces (cached per size) are not safe to share between threads: one draw at a time.
_LOCK = threading.Lock()


def _check_box(size: tuple[int, int], content_box: Box | None) -> Box:
    width, height = size
    if width < 1 or height < 1:
        raise RenderError(f"cannot render into an empty {width}x{height} canvas")
    if content_box is None:
        return (0, 0, width, height)
    x0, y0, x1, y1 = (int(value) for value in content_box)
    x0, y0 = max(0, x0), max(0, y0)
    x1, y1 = min(width, x1), min(height, y1)
    if x1 <= x0 or y1 <= y0:
        raise RenderError(f"content box {content_box} is empty inside a {width}x{height} canvas")
    return (x0, y0, x1, y1)


def render(
    text: str,
    category: ir.Category,
    size: tuple[int, int],
    content_box: Box | None = None,
    *,
    font_path: Path | str | None = None,
) -> Image.Image:
    """The candidate drawn on a white `size` (width, height) RGB canvas inside `content_box`.

    `content_box` is half-open (x0, y0, x1, y1), normally `content_bounds(crop)`; None means
    the whole canvas. `font_path` defaults to the `render_font_path` setting."""
    path = resolve_font_path(font_path)
    box = _check_box(size, content_box)
    if not text.strip():
        raise RenderError("nothing to render: the candidate is empty")
    canvas = Image.new("L", (int(size[0]), int(size[1])), 255)
    category = ir.Category(category)
    with _LOCK:
        if category == ir.Category.formula:
            render_formula(text, canvas, box)
        elif category == ir.Category.table:
            render_table(text, canvas, box, path)
        else:
            render_text(text, canvas, box, path)
    return canvas.convert("RGB")


def __getattr__(name: str) -> Any:
    # RENDERER_VERSION is computed on first use (it hashes the configured font file).
    if name == "RENDERER_VERSION":
        return renderer_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
