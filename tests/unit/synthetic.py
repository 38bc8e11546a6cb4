"""Pages with known text, drawn with a real TrueType font, for engine and region tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from ocrfleet import ir

FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")


@dataclass(frozen=True)
class Line:
    text: str
    bbox: ir.BBox  # the drawn ink


def font(size: int = 30) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(FONT), size)


def draw_page(
    size: tuple[int, int], lines: list[tuple[int, int, str]], font_size: int = 30
) -> tuple[Image.Image, list[Line]]:
    """A white RGB page with each (x, y, text) drawn in black; returns the ink boxes."""
    page = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(page)
    face = font(font_size)
    drawn = []
    for x, y, text in lines:
        draw.text((x, y), text, font=face, fill="black")
        x0, y0, x1, y1 = draw.textbbox((x, y), text, font=face)
        drawn.append(Line(text, ir.BBox(x0=x0, y0=y0, x1=x1, y1=y1)))
    return page, drawn


def line_image(text: str, font_size: int = 30, pad: int = 12) -> Image.Image:
    """One line of text, cropped with a margin, as a detector would hand it over."""
    face = font(font_size)
    x0, y0, x1, y1 = ImageDraw.Draw(Image.new("RGB", (1, 1))).textbbox((0, 0), text, font=face)
    image = Image.new("RGB", (x1 - x0 + 2 * pad, y1 - y0 + 2 * pad), "white")
    ImageDraw.Draw(image).text((pad - x0, pad - y0), text, font=face, fill="black")
    return image


def match(lines: list[Line], regions: list[ir.Region]) -> list[int]:
    """For each drawn line, the number of the region that covers most of its ink."""
    return [max(regions, key=lambda r: line.bbox.share_inside(r.bbox)).number for line in lines]
