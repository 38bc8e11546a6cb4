"""The pictures of the review pages: the page with boxes drawn, the region's crop enlarged,
and a candidate drawn by the frozen renderer, the same picture the Jev scorer is shown."""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from PIL import Image, ImageDraw

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.pipeline.images import load_image
from ocrfleet.pipeline.regions import crop
from ocrfleet.scorers.render import content_bounds, render
from ocrfleet.storage import read_uri

PAGE_WIDTH = 1100  # the page is shown at most this wide
CROP_HEIGHT = 120  # crops are enlarged to this height ...
CROP_WIDTH = 1100  # ... unless that makes them wider than this

# Outline colours of region states (queue.STATES) and of the region under review.
COLOURS = {
    "auto": (46, 160, 67),
    "accept": (31, 111, 235),
    "correct": (137, 87, 229),
    "unreadable": (110, 118, 129),
    "open": (218, 54, 51),
    "current": (218, 54, 51),
}


class PageImages:
    """Page images by URI, a few kept decoded: a region view asks for its page three times."""

    def __init__(self, settings: Settings, size: int = 8) -> None:
        self.settings = settings
        self.size = size
        self._pages: OrderedDict[str, Image.Image] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, uri: str) -> Image.Image:
        with self._lock:
            if uri in self._pages:
                self._pages.move_to_end(uri)
                return self._pages[uri]
        page = load_image(read_uri(uri, self.settings))
        with self._lock:
            self._pages[uri] = page
            while len(self._pages) > self.size:
                self._pages.popitem(last=False)
        return page


def _encode(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    if fmt == "JPEG":
        image.convert("RGB").save(buffer, format="JPEG", quality=85)
    else:
        image.save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def page_with_boxes(
    page: Image.Image, boxes: Sequence[tuple[tuple[int, int, int, int], str]]
) -> bytes:
    """The page at display size (JPEG) with each (bbox, state) outlined in its colour."""
    scale = min(1.0, PAGE_WIDTH / page.width)
    shown = page.convert("RGB")
    if scale < 1.0:
        shown = shown.resize((round(page.width * scale), round(page.height * scale)))
    draw = ImageDraw.Draw(shown)
    for (x0, y0, x1, y1), state in boxes:
        draw.rectangle(
            (x0 * scale - 2, y0 * scale - 2, x1 * scale + 2, y1 * scale + 2),
            outline=COLOURS[state],
            width=3 if state == "current" else 2,
        )
    return _encode(shown, "JPEG")


def _enlarge(image: Image.Image) -> Image.Image:
    scale = min(CROP_HEIGHT / max(1, image.height), CROP_WIDTH / max(1, image.width))
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(size, Image.Resampling.LANCZOS)


def region_crop(page: Image.Image, bbox: tuple[int, int, int, int]) -> Image.Image:
    return crop(page, ir.BBox(x0=bbox[0], y0=bbox[1], x1=bbox[2], y1=bbox[3])).convert("RGB")


def enlarged_crop(page: Image.Image, bbox: tuple[int, int, int, int]) -> bytes:
    return _encode(_enlarge(region_crop(page, bbox)))


def rendered_candidate(
    crop_image: Image.Image, text: str, category: str, font_path: Path | str
) -> Image.Image:
    """The candidate as the scorer sees it (raises RenderError when it cannot be drawn)."""
    return render(
        text,
        ir.Category(category),
        crop_image.size,
        content_bounds(crop_image),
        font_path=font_path,
    )


def enlarged_rendering(
    page: Image.Image,
    bbox: tuple[int, int, int, int],
    text: str,
    category: str,
    font_path: Path | str,
) -> bytes:
    return _encode(_enlarge(rendered_candidate(region_crop(page, bbox), text, category, font_path)))
