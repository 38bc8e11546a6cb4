"""What makes a unit unscoreable before any model runs: every scorer checks the same way,
so a `precheck_failed` verdict means the same thing whichever scorer gave it."""

from __future__ import annotations

from PIL import Image

from ocrfleet.config import Settings
from ocrfleet.scorers.base import Unit


def _single_colour(crop: Image.Image) -> bool:
    # getextrema per band: (min, max) equal in every band means one colour.
    extrema = crop.convert("RGB").getextrema()
    return all(low == high for low, high in extrema)


def precheck(unit: Unit, settings: Settings) -> str | None:
    """The reason this unit cannot be scored, or None when it can."""
    width, height = unit.crop.size
    if width == 0 or height == 0:
        return f"empty crop: {width}x{height} px"
    if min(width, height) < settings.precheck_min_side_px:
        return (
            f"crop too small: {width}x{height} px, "
            f"the shorter side must be at least {settings.precheck_min_side_px} px"
        )
    if _single_colour(unit.crop):
        return "empty crop: every pixel has the same colour"
    if not unit.text.strip():
        return "empty candidate text"
    if len(unit.text) > settings.precheck_max_text_chars:
        return (
            f"candidate text too long: {len(unit.text)} characters, "
            f"limit {settings.precheck_max_text_chars}"
        )
    return None
