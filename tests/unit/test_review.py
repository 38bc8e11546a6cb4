"""The review policy: every flag reason, the chosen engine, per-category and per-engine
thresholds, the best-of-N margin rule, and units built for scoring."""

from __future__ import annotations

import pytest
from PIL import Image, ImageDraw, ImageFont

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.pipeline.review import decide, score_units
from ocrfleet.scorers import load_policy
from ocrfleet.scorers.base import Policy

SETTINGS = Settings(threshold_text=0.6, threshold_formula=0.9, threshold_table=0.5)
POLICY = Policy(fixed={"text": 0.6, "formula": 0.9, "table": 0.5}, margin=0.0)


def region(number: int, category: ir.Category = ir.Category.text) -> ir.Region:
    return ir.Region(number=number, category=category, bbox=ir.BBox(x0=0, y0=0, x1=10, y1=10))


def cand(number: int, engine: str, text: str = "x", error: str | None = None) -> ir.Candidate:
    return ir.Candidate(region_number=number, engine=engine, text=text, error=error)


def scored(number: int, engine: str, value: float) -> ir.Score:
    return ir.Score(
        region_number=number,
        engine=engine,
        scorer="s",
        scorer_version="1",
        verdict=ir.Verdict.scored,
        score=value,
    )


def failed(number: int, engine: str, verdict: ir.Verdict) -> ir.Score:
    return ir.Score(
        region_number=number,
        engine=engine,
        scorer="s",
        scorer_version="1",
        verdict=verdict,
        error="why",
    )


def one(regions, candidates, scores) -> ir.Decision:
    (decision,) = decide(regions, candidates, scores, SETTINGS, POLICY)
    return decision


def test_best_scored_candidate_above_threshold_is_accepted() -> None:
    d = one(
        [region(1)],
        [cand(1, "rapidocr"), cand(1, "tesseract")],
        [scored(1, "rapidocr", 0.7), scored(1, "tesseract", 0.95)],
    )
    assert d == ir.Decision(
        region_number=1, chosen_engine="tesseract", accepted=True, threshold=0.6
    )


def test_threshold_is_inclusive() -> None:
    d = one([region(1)], [cand(1, "rapidocr")], [scored(1, "rapidocr", 0.6)])
    assert d.accepted and d.chosen_engine == "rapidocr"


def test_every_candidate_failed_is_engine_failed() -> None:
    d = one([region(1)], [cand(1, "rapidocr", error="boom"), cand(1, "tesseract", error="x")], [])
    assert (d.accepted, d.chosen_engine, d.flag_reason) == (False, None, "engine_failed")


def test_region_without_candidates_is_engine_failed() -> None:
    assert one([region(1)], [], []).flag_reason == "engine_failed"


def test_no_scored_candidate_gives_first_engines_verdict() -> None:
    d = one(
        [region(1)],
        [cand(1, "rapidocr"), cand(1, "tesseract")],
        [
            failed(1, "rapidocr", ir.Verdict.render_failed),
            failed(1, "tesseract", ir.Verdict.forward_failed),
        ],
    )
    assert d.flag_reason == "not_scored:render_failed"
    assert d.chosen_engine == "rapidocr" and not d.accepted


def test_first_engine_failing_to_read_is_skipped_for_the_verdict() -> None:
    d = one(
        [region(1)],
        [cand(1, "rapidocr", error="crash"), cand(1, "tesseract")],
        [failed(1, "tesseract", ir.Verdict.precheck_failed)],
    )
    assert d.flag_reason == "not_scored:precheck_failed"
    assert d.chosen_engine == "tesseract"


def test_candidate_the_scorer_returned_nothing_for() -> None:
    assert one([region(1)], [cand(1, "rapidocr")], []).flag_reason == "not_scored:missing"


def test_several_scored_all_below_threshold() -> None:
    d = one(
        [region(1)],
        [cand(1, "rapidocr"), cand(1, "tesseract")],
        [scored(1, "rapidocr", 0.2), scored(1, "tesseract", 0.5)],
    )
    assert d.flag_reason == "all_candidates_below_threshold"
    assert d.chosen_engine == "tesseract" and not d.accepted


def test_single_scored_candidate_below_threshold_is_low_score() -> None:
    # The other candidate is not scored: only one scored candidate competes.
    d = one(
        [region(1)],
        [cand(1, "rapidocr"), cand(1, "tesseract")],
        [failed(1, "rapidocr", ir.Verdict.render_failed), scored(1, "tesseract", 0.3)],
    )
    assert d.flag_reason == "low_score"
    assert d.chosen_engine == "tesseract"


def test_unscored_candidate_never_counts_as_a_score() -> None:
    # A high number on an unscored verdict cannot exist (ir forbids it); a scored one below
    # the threshold plus an unscored one must stay flagged.
    d = one(
        [region(1)],
        [cand(1, "rapidocr"), cand(1, "tesseract", error="x")],
        [scored(1, "rapidocr", 0.59)],
    )
    assert d.flag_reason == "low_score" and not d.accepted


def test_a_bound_is_never_accepted_and_says_why_it_is_flagged() -> None:
    def bounded(value: float) -> ir.Score:
        return scored(1, "rapidocr", value).model_copy(update={"verdict": ir.Verdict.bounded})

    # under the threshold: a low score, known without the re-read
    assert one([region(1)], [cand(1, "rapidocr")], [bounded(0.4)]).flag_reason == "low_score"
    # at or over it: only a ceiling, and the screen predicted the re-read would not reach it
    d = one([region(1)], [cand(1, "rapidocr")], [bounded(0.95)])
    assert not d.accepted and d.flag_reason == "screened" and d.chosen_engine == "rapidocr"


def test_thresholds_are_per_category() -> None:
    regions = [
        region(1, ir.Category.text),
        region(2, ir.Category.formula),
        region(3, ir.Category.table),
    ]
    candidates = [cand(1, "e"), cand(2, "e"), cand(3, "e")]
    scores = [scored(1, "e", 0.7), scored(2, "e", 0.7), scored(3, "e", 0.7)]
    decisions = decide(regions, candidates, scores, SETTINGS, POLICY)
    assert [d.accepted for d in decisions] == [True, False, True]
    assert [d.region_number for d in decisions] == [1, 2, 3]


def test_ties_go_to_the_earlier_engine() -> None:
    d = one(
        [region(1)],
        [cand(1, "minicpm"), cand(1, "rapidocr")],
        [scored(1, "minicpm", 0.8), scored(1, "rapidocr", 0.8)],
    )
    assert d.chosen_engine == "minicpm"


def test_another_engine_wins_only_by_more_than_the_margin() -> None:
    policy = Policy(fixed={"text": 0.5}, margin=0.1)
    candidates = [cand(1, "rapidocr"), cand(1, "tesseract")]

    def chosen(primary: float, other: float) -> str | None:
        scores = [scored(1, "rapidocr", primary), scored(1, "tesseract", other)]
        (d,) = decide([region(1)], candidates, scores, SETTINGS, policy)
        return d.chosen_engine

    assert chosen(0.80, 0.90) == "rapidocr"  # better, but not by more than the margin
    assert chosen(0.80, 0.95) == "tesseract"
    assert chosen(0.95, 0.20) == "rapidocr"


def test_the_primary_is_the_first_engine_that_was_scored() -> None:
    policy = Policy(fixed={"text": 0.5}, margin=0.1)
    d = one(
        [region(1)],
        [cand(1, "rapidocr", error="crash"), cand(1, "tesseract"), cand(1, "minicpm")],
        [scored(1, "tesseract", 0.7), scored(1, "minicpm", 0.75)],
    )
    assert d.chosen_engine == "minicpm"  # margin 0 in POLICY
    (d,) = decide(
        [region(1)],
        [cand(1, "rapidocr", error="crash"), cand(1, "tesseract"), cand(1, "minicpm")],
        [scored(1, "tesseract", 0.7), scored(1, "minicpm", 0.75)],
        SETTINGS,
        policy,
    )
    assert (d.chosen_engine, d.accepted) == ("tesseract", True)


def test_thresholds_per_engine_and_uncalibrated_kinds_go_to_review() -> None:
    policy = Policy(
        per_engine={
            "rapidocr": {"text": 0.9, "table": None},
            "other": {"text": 0.8, "table": None},
        }
    )
    regions = [region(1), region(2), region(3, ir.Category.table)]
    candidates = [cand(1, "rapidocr"), cand(2, "minicpm"), cand(3, "rapidocr")]
    scores = [scored(1, "rapidocr", 0.85), scored(2, "minicpm", 0.85), scored(3, "rapidocr", 1.0)]
    decisions = decide(regions, candidates, scores, Settings(), policy)
    assert [(d.accepted, d.flag_reason) for d in decisions] == [
        (False, "low_score"),
        (True, None),  # an engine the calibration does not name gets the "other" threshold
        (False, "uncalibrated"),
    ]


def test_a_threshold_setting_overrides_the_calibration_for_every_engine() -> None:
    policy = load_policy(Settings(threshold_text=0.25))
    assert policy.threshold("rapidocr", "text") == policy.threshold("minicpm", "text") == 0.25
    calibrated = load_policy(Settings())
    from ocrfleet.scorers.consensus import WEIGHTS_PATH, load_calibration

    calibration = load_calibration(WEIGHTS_PATH)
    assert calibrated.margin == calibration.margin
    for engine in ("rapidocr", "tesseract", "minicpm"):
        assert calibrated.threshold(engine, "text") == calibration.threshold(engine, "text")


# ---- score_units: real pixels, real scorer ---------------------------------------------


def _page() -> tuple[Image.Image, list[ir.Region]]:
    font = ImageFont.truetype("/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf", 28)
    page = Image.new("RGB", (700, 160), "white")
    draw = ImageDraw.Draw(page)
    draw.text((20, 20), "Invoice number 4417", font=font, fill="black")
    draw.text((20, 90), "paid in full", font=font, fill="black")
    regions = [
        ir.Region(number=1, bbox=ir.BBox(x0=10, y0=12, x1=420, y1=62)),
        ir.Region(number=2, bbox=ir.BBox(x0=10, y0=82, x1=260, y1=132)),
    ]
    return page, regions


@pytest.fixture(scope="module")
def scorer():
    from ocrfleet.scorers import load_scorer

    return load_scorer(Settings(scorer="consensus"))


def test_score_units_scores_every_non_error_candidate_in_order(scorer) -> None:
    from ocrfleet.engines import load_recognisers
    from ocrfleet.pipeline.regions import crop

    page, regions = _page()
    rapid, tess = load_recognisers(Settings(engines=["rapidocr", "tesseract"]))
    (r1,) = rapid.recognise([crop(page, regions[0].bbox)])
    (t2,) = tess.recognise([crop(page, regions[1].bbox)])
    assert r1[0] == "Invoice number 4417"  # clean pixels: the engine reads them right
    candidates = [
        ir.Candidate(region_number=1, engine="rapidocr", text=r1[0], confidence=r1[1]),
        ir.Candidate(region_number=1, engine="minicpm", text="Invoice numbr 4417"),
        cand(2, "rapidocr", error="engine crashed"),
        ir.Candidate(region_number=2, engine="tesseract", text=t2[0], confidence=t2[1]),
    ]
    scores = score_units(page, regions, candidates, scorer)
    assert [(s.region_number, s.engine) for s in scores] == [
        (1, "rapidocr"),
        (1, "minicpm"),
        (2, "tesseract"),
    ]
    assert all(s.verdict == ir.Verdict.scored for s in scores)
    assert scores[0].score > 0.9 > scores[1].score  # the exact reading beats the misspelt one
    decisions = decide(regions, candidates, scores, Settings(threshold_text=0.5), POLICY)
    assert (decisions[0].chosen_engine, decisions[0].accepted) == ("rapidocr", True)
    assert decisions[1].chosen_engine == "tesseract"


def test_score_units_with_only_error_candidates_scores_nothing(scorer) -> None:
    page, regions = _page()
    assert score_units(page, regions, [cand(1, "rapidocr", error="x")], scorer) == []


def test_candidate_of_an_unknown_region_is_an_error(scorer) -> None:
    page, regions = _page()
    with pytest.raises(ValueError, match="region 9"):
        score_units(page, regions, [cand(9, "rapidocr", "x")], scorer)


def test_an_empty_reading_is_never_accepted_however_it_scored() -> None:
    regions = [region(1), region(2, ir.Category.table)]
    candidates = [cand(1, "rapidocr", " \n"), cand(2, "minicpm", "")]
    scores = [scored(1, "rapidocr", 0.99), scored(2, "minicpm", 0.99)]
    decisions = decide(regions, candidates, scores, SETTINGS, POLICY)
    assert [(d.chosen_engine, d.accepted, d.flag_reason) for d in decisions] == [
        ("rapidocr", False, "empty_reading"),
        ("minicpm", False, "empty_reading"),
    ]
    # an empty reading that scored low keeps the reason it already had
    (low,) = decide(
        [region(1)], [cand(1, "rapidocr", "")], [scored(1, "rapidocr", 0.1)], SETTINGS, POLICY
    )
    assert low.flag_reason == "low_score"
