"""precheck: the reasons a unit is not scored, shared by every scorer."""

from __future__ import annotations

import pytest
from PIL import Image, ImageDraw

from ocrfleet.config import Settings
from ocrfleet.ir import Category
from ocrfleet.scorers.base import Unit
from ocrfleet.scorers.precheck import precheck

SETTINGS = Settings(precheck_min_side_px=4, precheck_max_text_chars=20)


def unit(crop: Image.Image, text: str = "hello") -> Unit:
    return Unit(crop=crop, text=text, category=Category.text, region_number=1, engine="e")


def page_crop(size: tuple[int, int] = (60, 20)) -> Image.Image:
    crop = Image.new("RGB", size, "white")
    ImageDraw.Draw(crop).line((1, 1, size[0] - 2, size[1] - 2), fill="black")
    return crop


def test_a_normal_unit_passes() -> None:
    assert precheck(unit(page_crop()), SETTINGS) is None


@pytest.mark.parametrize(
    ("crop", "text", "reason"),
    [
        (Image.new("RGB", (0, 10)), "hello", "empty crop"),
        (Image.new("RGB", (50, 30), (255, 255, 255)), "hello", "same colour"),
        (Image.new("L", (50, 30), 0), "hello", "same colour"),
        (page_crop((60, 3)), "hello", "too small"),
        (page_crop(), " \n\t ", "empty candidate"),
        (page_crop(), "", "empty candidate"),
        (page_crop(), "x" * 21, "too long"),
    ],
)
def test_unscoreable_units_have_a_reason(crop: Image.Image, text: str, reason: str) -> None:
    assert reason in (precheck(unit(crop, text), SETTINGS) or "")


def test_limits_come_from_settings() -> None:
    crop = page_crop((60, 3))
    assert precheck(unit(crop), Settings(precheck_min_side_px=3)) is None
    assert precheck(unit(page_crop(), "x" * 21), Settings(precheck_max_text_chars=21)) is None
