"""CTC posteriors from the real engines on real scanned lines: they decode to what the engine
read, prefer the engine's reading to any one-character change of it, do not depend on the
batch, and come from the reading's own model call."""

from __future__ import annotations

import random

import numpy as np
import pytest
from PIL import Image

from ocrfleet.engines.rapidocr import RapidRecogniser
from ocrfleet.pipeline.images import load_image
from ocrfleet.scorers import ctc
from tests.conftest import REALDOCS

UW3 = REALDOCS / "uw3_500_ocropy" / "lines"


def uw3_lines(n: int) -> list[tuple[Image.Image, str]]:
    """The first `n` UW3 line scans (sorted by name) with their ground truth."""
    if not UW3.is_dir():
        pytest.skip(f"no UW3 lines under {UW3} (set OCRFLEET_REALDOCS)")
    out = []
    for png in sorted(UW3.glob("*.png"))[:n]:
        truth = " ".join(png.with_suffix("").with_suffix(".gt.txt").read_text().split())
        out.append((load_image(png.read_bytes()), truth))
    return out


@pytest.fixture(scope="module")
def rapid() -> RapidRecogniser:
    return RapidRecogniser(batch_size=4, threads=1)


def substitutions(text: str, alphabet: str, rng: random.Random, count: int) -> list[str]:
    out = []
    while len(out) < count:
        i = rng.randrange(len(text))
        char = rng.choice(alphabet)
        if char != text[i]:
            out.append(text[:i] + char + text[i + 1 :])
    return out


def test_rapidocr_posteriors_decode_to_its_reading_and_prefer_it(rapid) -> None:
    lines = uw3_lines(12)
    crops = [crop for crop, _ in lines]
    ctc.RECENT.clear()
    posteriors = rapid.posteriors(crops)
    readings = rapid.recognise(crops)
    rng = random.Random(11)
    alphabet = "aeiostnrlcdu0123456789.,-E"
    for posterior, (text, _) in zip(posteriors, readings, strict=True):
        assert posterior.engine == "rapidocr"
        assert posterior.text() == text
        best = posterior.log_likelihood(text)
        for other in substitutions(text, alphabet, rng, 5):
            assert posterior.log_likelihood(other) < best, (text, other)
        evidence = posterior.evidence()
        assert 0.0 < evidence.min_char_prob <= 1.0 and evidence.mean_log_prob <= 0.0


def test_rapidocr_posterior_of_a_crop_does_not_depend_on_its_batch(rapid) -> None:
    crops = [crop for crop, _ in uw3_lines(9)]
    ctc.RECENT.clear()
    together = rapid.posteriors(crops)
    ctc.RECENT.clear()
    alone = rapid.posteriors([crops[4]])[0]
    assert alone.charset == together[4].charset
    np.testing.assert_allclose(alone.log_probs, together[4].log_probs, atol=1e-4)


def test_reading_keeps_posteriors_for_the_scorer(rapid) -> None:
    """The scorer's reader, another instance of the same model, gets the posteriors of
    crops the primary engine read from that reading, not from a second model call."""
    crops = [crop for crop, _ in uw3_lines(5)]
    ctc.RECENT.clear()
    rapid.recognise_words(crops)
    kept = [ctc.RECENT.get(rapid.version, ctc.crop_key(c)) for c in crops]
    assert all(posterior is not None for posterior in kept)
    reader = RapidRecogniser(batch_size=16, threads=1)
    assert reader.version == rapid.version
    assert all(a is b for a, b in zip(reader.posteriors(crops), kept, strict=True))


def test_cross_scores_rank_the_truth_above_a_wrong_reading(rapid) -> None:
    """Forced alignment scores text the model did not produce: the ground truth of a clean
    line scores far above the same line with a word swapped for another."""
    lines = uw3_lines(10)
    posteriors = rapid.posteriors([crop for crop, _ in lines])
    for posterior, (_, truth) in zip(posteriors, lines, strict=True):
        words = truth.split()
        if len(words) < 3:
            continue
        wrong = " ".join([*words[:-2], words[-1], words[-2]])
        if wrong != truth:
            assert posterior.log_likelihood(truth) > posterior.log_likelihood(wrong) + 5.0
