"""Plain text: wrapped to the content box at the largest font size that fits."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from ocrfleet.scorers.render.bounds import Box
from ocrfleet.scorers.render.fonts import load_font

# Baseline-to-baseline distance in em.
LINE_SPACING = 1.2
# Break opportunities: whitespace runs, runs of non-CJK letters (kept whole), single CJK
# characters (a line may break between any two of them).
_CJK = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef\u3000-\u303f"
_TOKEN = re.compile(rf"\s+|[^\s{_CJK}]+|[{_CJK}]")


@dataclass(frozen=True)
class Block:
    """Laid-out lines and the ink extents of the block relative to the first baseline."""

    lines: tuple[str, ...]
    pitch: int
    left: int
    top: int
    right: int
    bottom: int

    @property
    def width(self) -> int:
        return self.right - self.left

    @property
    def height(self) -> int:
        return self.bottom - self.top


def _split_long(token: str, width_of, max_width: int) -> list[str]:
    pieces, piece, used = [], "", 0.0
    for char in token:
        advance = width_of(char)
        if piece and used + advance > max_width:
            pieces.append(piece)
            piece, used = "", 0.0
        piece += char
        used += advance
    return [*pieces, piece] if piece else pieces


def wrap(text: str, font: ImageFont.FreeTypeFont, max_width: int | None) -> list[str]:
    """Greedy wrap of each `\\n`-separated paragraph; `max_width=None` only splits lines.

    Widths add up token by token (BASIC layout has no shaping across tokens), so each
    distinct token is measured once."""
    widths: dict[str, float] = {}

    def width_of(piece: str) -> float:
        if piece not in widths:
            widths[piece] = font.getlength(piece)
        return widths[piece]

    out: list[str] = []
    for paragraph in text.split("\n"):
        if max_width is None:
            out.append(paragraph.rstrip())
            continue
        line, used = "", 0.0
        for token in _TOKEN.findall(paragraph):
            if token.isspace():
                if line:
                    line += " "
                    used += width_of(" ")
                continue
            if used + width_of(token) <= max_width:
                line += token
                used += width_of(token)
                continue
            if line.strip():
                out.append(line.rstrip())
            line, used = "", 0.0
            if width_of(token) <= max_width:
                line, used = token, width_of(token)
            else:
                *full, line = _split_long(token, width_of, max_width)
                out.extend(full)
                used = sum(width_of(char) for char in line)
        out.append(line.rstrip())
    return out


def measure(lines: list[str], font: ImageFont.FreeTypeFont, size: int) -> Block:
    pitch = max(1, round(size * LINE_SPACING))
    left = top = 10**9
    right = bottom = -(10**9)
    for number, line in enumerate(lines):
        if not line:
            continue
        x0, y0, x1, y1 = font.getbbox(line, anchor="ls")
        baseline = number * pitch
        left, right = min(left, x0), max(right, x1)
        top, bottom = min(top, baseline + y0), max(bottom, baseline + y1)
    if right < left:  # no ink at all
        left = top = right = bottom = 0
    return Block(tuple(lines), pitch, left, top, right, bottom)


def largest_fitting(fits, upper: int) -> int:
    """Largest integer size in [1, upper] for which `fits(size)` holds, 1 if none does."""
    low, high, best = 1, max(1, upper), 1
    while low <= high:
        middle = (low + high) // 2
        if fits(middle):
            best, low = middle, middle + 1
        else:
            high = middle - 1
    return best


def draw_block(
    draw: ImageDraw.ImageDraw, block: Block, font: ImageFont.FreeTypeFont, x: int, y: int
) -> None:
    """Draw `block` with its ink box's top-left corner at (x, y)."""
    for number, line in enumerate(block.lines):
        if line:
            origin = (x - block.left, y - block.top + number * block.pitch)
            draw.text(origin, line, font=font, fill=0, anchor="ls")


def render_text(text: str, canvas: Image.Image, box: Box, font_path: Path) -> None:
    x0, y0, x1, y1 = box
    width, height = x1 - x0, y1 - y0

    def layout(size: int) -> Block:
        font = load_font(font_path, size)
        return measure(wrap(text, font, width), font, size)

    def fits(size: int) -> bool:
        block = layout(size)
        return block.width <= width and block.height <= height

    size = largest_fitting(fits, 2 * height)
    block = layout(size)
    # Left-aligned, centred vertically in the content box.
    draw_block(
        ImageDraw.Draw(canvas),
        block,
        load_font(font_path, size),
        x0,
        y0 + (height - block.height) // 2,
    )
