"""The consensus scorer on real pixels with the real engines: ranking, verdicts, the
weights file, and reproducible training."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench.synthetic import perturb, synthetic_lines
from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.pipeline.images import load_image
from ocrfleet.scorers import load_scorer, second_readers
from ocrfleet.scorers.base import Unit
from ocrfleet.scorers.consensus import (
    WEIGHTS_PATH,
    ConsensusFeatures,
    ConsensusScorer,
    load_calibration,
)
from ocrfleet.scorers.features import (
    DECREASING,
    FEATURE_NAMES,
    INCREASING,
    optimistic,
    pessimistic,
    rereads_for,
    stops_before_lowercase,
    unit_features,
)
from tests.conftest import REALDOCS

UW3 = REALDOCS / "uw3_500_ocropy" / "lines"
SETTINGS = Settings(scorer="consensus")


@pytest.fixture(scope="module")
def readers():
    return second_readers(SETTINGS)


@pytest.fixture(scope="module")
def scorer(readers) -> ConsensusScorer:
    return ConsensusScorer(SETTINGS, readers)


def _uw3(n: int) -> list[tuple[Image.Image, str]]:
    if not UW3.is_dir():
        pytest.skip(f"no UW3 lines under {UW3} (set OCRFLEET_REALDOCS)")
    return [_line(png) for png in sorted(UW3.glob("*.png"))[:n]]


def _uw3_line(name: str) -> tuple[Image.Image, str]:
    png = UW3 / f"{name}.png"
    if not png.is_file():
        pytest.skip(f"no UW3 line {png}")
    return _line(png)


def _line(png: Path) -> tuple[Image.Image, str]:
    truth = " ".join(png.with_suffix("").with_suffix(".gt.txt").read_text().split())
    return load_image(png.read_bytes()), truth


def unit(crop: Image.Image, text: str, engine: str = "minicpm", n: int = 1, **kw) -> Unit:
    return Unit(
        crop=crop,
        text=text,
        category=kw.pop("category", ir.Category.text),
        region_number=n,
        engine=engine,
        **kw,
    )


def test_correct_text_outscores_perturbed_text_on_real_scans(scorer) -> None:
    rng = random.Random(7)
    lines = _uw3(10)
    units, kinds = [], []
    for n, (image, truth) in enumerate(lines, start=1):
        units.append(unit(image, truth, n=n))
        kinds.append(True)
        for _ in range(2):
            _, changed = perturb(truth, rng)
            units.append(unit(image, changed, n=n))
            kinds.append(False)
    scores = scorer.score(units)
    assert all(s.verdict == ir.Verdict.scored for s in scores)
    good = [s.score for s, k in zip(scores, kinds, strict=True) if k]
    bad = [s.score for s, k in zip(scores, kinds, strict=True) if not k]
    assert np.mean(good) > np.mean(bad) + 0.2
    # and line by line, the truth beats most of its perturbations
    wins = sum(
        scores[3 * i].score > scores[3 * i + j].score for i in range(len(lines)) for j in (1, 2)
    )
    assert wins >= 0.8 * 2 * len(lines)


def test_scores_carry_identity_and_are_probabilities(scorer) -> None:
    image, truth = _uw3(1)[0]
    (score,) = scorer.score([unit(image, truth, engine="rapidocr", n=5, confidence=0.99)])
    assert (score.region_number, score.engine, score.scorer) == (5, "rapidocr", "consensus")
    assert score.scorer_version == scorer.version
    assert 0.0 <= score.score <= 1.0


def test_verdicts_for_units_that_cannot_be_scored(scorer) -> None:
    image, truth = _uw3(1)[0]
    blank = Image.new("RGB", (200, 40), "white")
    empty = Image.new("RGB", (0, 0))
    scores = scorer.score(
        [
            unit(blank, "anything"),
            unit(empty, "anything"),
            unit(image, "   "),
            unit(image, truth),
        ]
    )
    verdicts = [s.verdict for s in scores]
    assert verdicts == [
        ir.Verdict.precheck_failed,
        ir.Verdict.precheck_failed,
        ir.Verdict.precheck_failed,
        ir.Verdict.scored,
    ]
    assert all(s.score is None and s.error for s in scores[:3])
    assert "empty candidate text" in scores[2].error


def test_a_failing_second_read_is_forward_failed_for_that_unit_only(scorer) -> None:
    # Tesseract refuses images wider than 32767 px ("Image too large"): a real failure of
    # the second read. It must not fail the other unit of the batch.
    image, truth = _uw3(1)[0]
    wide = Image.new("RGB", (33000, 40), "white")
    wide.paste(image.resize((image.width * 40 // image.height, 40)), (10, 0))
    bad, good = scorer.score(
        [
            unit(wide, truth, engine="rapidocr", n=1, confidence=0.9),
            unit(image, truth, engine="rapidocr", n=2, confidence=0.9),
        ]
    )
    assert bad.verdict == ir.Verdict.forward_failed and bad.score is None
    assert "re-read by tesseract failed" in bad.error
    assert good.verdict == ir.Verdict.scored


def test_every_other_engine_re_reads(scorer) -> None:
    assert [r.name for r in scorer.features.readers] == ["rapidocr", "tesseract", "easyocr"]
    assert rereads_for("rapidocr") == ("tesseract", "easyocr")
    assert rereads_for("tesseract") == ("rapidocr", "easyocr")
    assert rereads_for("minicpm") == ("rapidocr", "tesseract", "easyocr")
    image, truth = _uw3(1)[0]
    (own, other) = scorer.features.compute(
        [unit(image, truth, engine="rapidocr", confidence=0.9), unit(image, truth)]
    )
    names = list(FEATURE_NAMES)
    assert own[names.index("rapidocr_missing")] == 1 and own[names.index("tesseract_missing")] == 0
    assert other[names.index("rapidocr_missing")] == other[names.index("tesseract_missing")] == 0
    # character evidence from every CTC model, the candidate's own engine's included
    assert own[names.index("ctc_rapidocr_missing")] == own[names.index("ctc_easyocr_missing")]
    assert own[names.index("ctc_rapidocr_missing")] == 0
    assert other[names.index("ctc_rapidocr_missing")] == other[names.index("ctc_easyocr_missing")]
    assert other[names.index("ctc_rapidocr_missing")] == 0
    # a confidence-less engine is first-class: its own column says so, nothing else is lost
    assert other[names.index("conf_missing")] == 1 and own[names.index("conf_missing")] == 0


def test_cross_scores_find_the_truth_more_plausible_than_its_perturbations(scorer) -> None:
    """Under each CTC model, a line's true text is likelier than a one-edit change of it,
    and the model's own reading is the rival a perturbed candidate loses to."""
    rng = random.Random(3)
    names = list(FEATURE_NAMES)
    lines = _uw3(8)
    units = []
    for n, (image, truth) in enumerate(lines, start=1):
        units.append(unit(image, truth, n=n))
        units.append(unit(image, perturb(truth, rng)[1], n=n))
    computed = scorer.features.compute(units)
    for model in ("rapidocr", "easyocr"):
        gap = names.index(f"ctc_{model}_cand_gap")
        wins = sum(computed[2 * i][gap] > computed[2 * i + 1][gap] for i in range(len(lines)))
        assert wins >= len(lines) - 1, model
    rival = names.index("ctc_rival_gap")
    assert sum(computed[2 * i + 1][rival] > 0 for i in range(len(lines))) >= len(lines) - 1


def test_weights_file_matches_the_code_and_records_its_evidence() -> None:
    raw = json.loads(WEIGHTS_PATH.read_text())
    assert tuple(raw["feature_names"]) == FEATURE_NAMES
    training = raw["training"]
    assert len(training["data_sha256"]) == 64
    assert set(training["rows_sha256"]) == {"sroie", "uw3", "unlv", "pdf"}
    assert set(training["cv_auroc_out_of_fold"]) == {"sroie", "uw3", "unlv", "pdf"}
    for group, evidence in training["threshold_evidence"].items():
        threshold = raw["thresholds"][group]["text"]
        assert evidence["threshold"] == threshold
        if threshold is not None:  # the promise the threshold was chosen to keep
            assert evidence["lower_bound_95"] >= training["precision_target"]
    assert raw["best_of_n_margin"] >= 0
    # the screen loses at most its target share of each engine's accepted candidates
    screen = training["screen"]
    for by_set in screen["by_set"].values():
        accepted = sum(item["accepted"] for item in by_set.values())
        lost = sum(item["accepted_screened"] for item in by_set.values())
        assert lost <= screen["loss_target"] * accepted
    # the path with the second stage keeps the promise, and its cut loses what the screen may
    second = training["second"]
    for group, by_set in second["by_set"].items():
        path = second["threshold_evidence"][group]["path"]
        if path["accepted"]:
            assert path["lower_bound_95"] >= training["precision_target"]
        accepted = sum(item["accepted_full"] for item in by_set.values())
        lost = sum(item["lost_unread"] for item in by_set.values())
        assert lost <= screen["loss_target"] * accepted
    # the path with the early accept before it keeps the promise too
    for evidence in training["early"]["threshold_evidence"].values():
        if evidence["path"]["accepted"]:
            assert evidence["path"]["lower_bound_95"] >= training["precision_target"]


def test_the_shipped_weights_are_fitted_on_the_default_readers_readings() -> None:
    """A calibration belongs to the readings it was fitted on: the default recogniser's
    (int8 since Session 18; fp32's confidences differ) and the pinned EasyOCR model's."""
    from ocrfleet.engines import easyocr
    from ocrfleet.engines.rapidocr import REC_MODELS, recogniser_version

    readers = json.loads(WEIGHTS_PATH.read_text(encoding="utf-8"))["training"]["readers"]
    default = REC_MODELS[Settings.model_fields["rec_precision"].default]
    assert readers["rapidocr"] == [recogniser_version(default)]
    assert readers["easyocr"] == [easyocr.version()]
    assert set(readers) == {"rapidocr", "tesseract", "easyocr"}


def test_shipped_model_scores_without_scikit_learn() -> None:
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from ocrfleet.scorers.consensus import load_calibration\n"
        "c = load_calibration()\n"
        "p = c.predict(np.zeros((3, len(c.feature_names))))\n"
        "assert p.shape == (3,) and ((0 <= p) & (p <= 1)).all()\n"
        "assert 'sklearn' not in sys.modules and 'scipy' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_described_version_is_the_loaded_scorers_version(scorer) -> None:
    from ocrfleet.scorers import describe_scorer

    described = describe_scorer(SETTINGS)
    assert described["version"] == scorer.version == load_scorer(SETTINGS).version
    assert described["weights_sha256"] == load_calibration(WEIGHTS_PATH).sha256


def test_unknown_scorer_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="scorer\n.*'consensus' or 'jev'"):
        Settings(scorer="nope")


def test_version_follows_the_weights_file(tmp_path: Path, readers) -> None:
    raw = json.loads(WEIGHTS_PATH.read_text())
    raw["trees"]["baseline"] += 1.0
    other = tmp_path / "w.json"
    other.write_text(json.dumps(raw))
    a = ConsensusScorer(SETTINGS, readers)
    b = ConsensusScorer(SETTINGS, readers, weights=other)
    assert a.version != b.version
    assert a.version.startswith(f"consensus-{load_calibration(WEIGHTS_PATH).sha256[:12]}+")


def test_the_settings_name_the_weights_the_policy_and_run_id_use(tmp_path: Path) -> None:
    from ocrfleet.errors import ConfigError
    from ocrfleet.scorers import describe_scorer, load_policy

    raw = json.loads(WEIGHTS_PATH.read_text())
    raw["thresholds"]["rapidocr"]["text"] = 0.5
    other = tmp_path / "w.json"
    other.write_text(json.dumps(raw))
    refit = Settings(scorer="consensus", consensus_weights_path=other)
    assert load_policy(refit).per_engine["rapidocr"]["text"] == 0.5
    assert load_policy(SETTINGS).per_engine["rapidocr"]["text"] != 0.5
    assert describe_scorer(refit)["weights_sha256"] != describe_scorer(SETTINGS)["weights_sha256"]
    missing = Settings(scorer="consensus", consensus_weights_path=tmp_path / "none.json")
    with pytest.raises(ConfigError, match="OCRFLEET_CONSENSUS_WEIGHTS_PATH"):
        load_policy(missing)


def test_weights_for_other_features_are_refused(tmp_path: Path, readers) -> None:
    raw = json.loads(WEIGHTS_PATH.read_text())
    raw["feature_names"] = raw["feature_names"][:-1]
    other = tmp_path / "w.json"
    other.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="other features"):
        ConsensusScorer(SETTINGS, readers, weights=other)


def test_exported_trees_predict_what_scikit_learn_predicts() -> None:
    pytest.importorskip("sklearn")
    from bench.train_consensus import fit_trees
    from ocrfleet.scorers.model import trees_from_sklearn

    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, len(FEATURE_NAMES)))
    y = (x[:, 5] + 0.5 * x[:, 7] + rng.normal(scale=0.5, size=400)) > 0
    model = fit_trees(x, y)
    ours = trees_from_sklearn(model).raw(x)
    assert np.allclose(ours, model.decision_function(x), atol=1e-9)


def test_training_is_reproducible_and_keeps_its_promise(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    from bench.train_consensus import train

    rows = real_rows(32)
    first = train(rows, tmp_path / "a.json")
    second = train(rows, tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    fewer = train(rows[:-6], tmp_path / "c.json")
    assert fewer["training"]["data_sha256"] != first["training"]["data_sha256"]
    assert second["training"]["n"] > len(rows)  # both engines' candidates and augmentation
    load_calibration(tmp_path / "a.json")  # a file the scorer can load
    # --keep: another file's stages stay as they are; only the early accept is fitted in
    kept = train(rows[:-6], tmp_path / "d.json", keep=first)
    for key in ("trees", "thresholds", "screen", "second", "calibration"):
        assert kept[key] == first[key]
    assert kept["training"]["data_sha256"] == first["training"]["data_sha256"]
    assert kept["early"]["trees"] == fewer["early"]["trees"]  # fitted on the rows given
    assert kept["training"]["early"]["rows_sha256"] == fewer["training"]["rows_sha256"]
    load_calibration(tmp_path / "d.json")


def real_rows(n: int):
    """UW3 lines read by every engine, with the CTC models' evidence, as bench/realrows.py
    builds them (its first pass, then its CTC pass)."""
    from bench.realrows import FIRST_PASS, RealRow, ctc_records, read_all, with_ctc
    from bench.train_consensus import partner_of

    if not UW3.is_dir():
        pytest.skip(f"no UW3 lines under {UW3} (set OCRFLEET_REALDOCS)")
    pngs = sorted(UW3.glob("*.png"))[:n]
    images = [load_image(png.read_bytes()) for png in pngs]
    readers = second_readers(SETTINGS)
    reads = {r.name: read_all(r, images) for r in readers if r.name in FIRST_PASS}
    rows = [
        RealRow(
            "uw3",
            png.stem[:4],
            png.stem,
            "gt",
            str(png),
            None,
            png.with_suffix("").with_suffix(".gt.txt").read_text().strip(),
            True,
            {name: values[k] for name, values in reads.items()},
            png.stem,
        )  # fmt: skip
        for k, png in enumerate(pngs)
    ]
    ctc_readers = [r for r in readers if r.name not in FIRST_PASS or hasattr(r, "posteriors")]
    return with_ctc(rows, ctc_records(rows, partner_of(rows), ctc_readers))


def test_cached_evidence_gives_the_features_the_scorer_computes(readers) -> None:
    """Training's features (from bench/realrows.py's cache) are the live scorer's: the same
    re-reads, the same CTC evidence and likelihoods, for every kind of candidate."""
    from bench.train_consensus import build_examples, featurize

    ex = build_examples(real_rows(5))
    cached, ok = featurize(ex)
    live = ConsensusFeatures(SETTINGS, readers).compute(ex.units)
    assert ok.all() and {u.engine for u in ex.units} >= {"rapidocr", "tesseract", "easyocr"}
    for unit_, row, value in zip(ex.units, cached, live, strict=True):
        assert np.allclose(row, value, atol=1e-6), unit_.engine


def test_synthetic_lines_are_seeded() -> None:
    a = synthetic_lines(3, seed=11)
    b = synthetic_lines(3, seed=11)
    assert [x.truth for x in a] == [x.truth for x in b]
    assert all(x.image.tobytes() == y.image.tobytes() for x, y in zip(a, b, strict=True))


def test_the_least_confident_word_is_a_feature_of_its_own() -> None:
    from ocrfleet.scorers.features import engine_features, least_word_confidence

    box = ir.BBox(x0=0, y0=0, x1=10, y1=10)
    words = [
        ir.Word(text="Total", bbox=box, confidence=0.99),
        ir.Word(text="12,00", bbox=box, confidence=0.41),
        ir.Word(text="guess", bbox=box, confidence=0.05, approximate=True),
    ]
    assert least_word_confidence(words) == 0.41  # placed words carry no confidence of their own
    assert least_word_confidence([]) is None
    with_words = engine_features("rapidocr", 0.97, 0.41)
    assert with_words["wconf_rapidocr"] < with_words["conf_rapidocr"]
    # without word confidences the column falls back to the line's
    assert engine_features("rapidocr", 0.97)["wconf_rapidocr"] == with_words["conf_rapidocr"]
    assert engine_features("minicpm", None, 0.5)["wconf_other"] == 0.0


def test_a_full_stop_before_a_lower_case_word_counts_as_a_lost_comma() -> None:
    """UW3 lines whose commas every reader took for full stops, and what must not count."""
    assert stops_before_lowercase("eral medical diagnosis. drug ther-") == 1
    assert stops_before_lowercase("M. Sabourin, A. Mitiche, D. Thomas. and G. Nagy") == 1
    assert stops_before_lowercase("features are dense. stable. and fast. so") == 3
    for text in ("e.g. the", "et al. and", "Fig. 3 shows", "the end. The next", "a job."):
        assert stops_before_lowercase(text) == 0, text
    column = FEATURE_NAMES.index("text_stop_lower")
    for text, count in (("leads. and hepatic", 1.0), ("leads, and hepatic", 0.0)):
        row = unit_features(text, ir.Category.text, "rapidocr", 0.99, {})
        assert row[column] == count
    assert "text_stop_lower" in DECREASING  # more of them never raises a score


def test_a_doubtful_word_never_raises_the_score(scorer) -> None:
    image, truth = _uw3(1)[0]
    sure, doubtful = scorer.score(
        [
            unit(image, truth, engine="rapidocr", n=1, confidence=0.98, word_confidence=0.97),
            unit(image, truth, engine="rapidocr", n=1, confidence=0.98, word_confidence=0.30),
        ]
    )
    assert doubtful.score <= sure.score


class _Counting:
    """A real re-reader that counts the crops it is asked to read (`crops`: readings or
    posteriors; `read`: readings only)."""

    def __init__(self, reader) -> None:
        self.reader, self.name, self.version = reader, reader.name, reader.version
        self.crops = self.read = 0
        if callable(getattr(reader, "posteriors", None)):
            self.posteriors = self._posteriors

    def _posteriors(self, crops):
        self.crops += len(crops)
        return self.reader.posteriors(crops)

    def recognise_words(self, crops):
        self.crops += len(crops)
        self.read += len(crops)
        return self.reader.recognise_words(crops)

    def recognise(self, crops):
        return [(t, c) for t, c, _ in self.recognise_words(crops)]


def test_a_bounded_unit_is_not_re_read_and_its_bound_holds(readers) -> None:
    lines = _uw3(6)
    # the same real lines as RapidOCR candidates the engine doubted and ones it was sure of
    units = [
        unit(image, truth, engine="rapidocr", n=n, confidence=conf, word_confidence=conf)
        for n, ((image, truth), conf) in enumerate(
            ((line, conf) for line in lines for conf in (0.55, 0.9999)), start=1
        )
    ]
    exact = ConsensusScorer(SETTINGS, readers).score(units)
    counting = [_Counting(r) for r in readers]
    scorer = ConsensusScorer(SETTINGS, counting)
    threshold = scorer.calibration.threshold("rapidocr", "text")
    screened = scorer.score_against(units, lambda u: threshold)
    bounded = [s.verdict == ir.Verdict.bounded for s in screened]
    assert any(bounded) and not all(bounded)
    calibration = scorer.calibration
    early, cut = calibration.second_stage("rapidocr")
    read = set()  # the crops read by tesseract: those of units the first stage left open
    unread = 0
    for u, e, s in zip(units, exact, screened, strict=True):
        alone = ConsensusFeatures(SETTINGS, readers).compute([u], readers=())[0]
        right = _early(calibration, alone)
        if right >= max(calibration.early_threshold("rapidocr"), threshold):
            assert s.verdict == ir.Verdict.scored and s.score == right  # accepted unread
            unread += 1
            continue
        rows, free = optimistic(alone, "rapidocr")
        upper = calibration.calibration(calibration.trees.upper_raw(rows[None], free[None]))[0]
        predicted = calibration.screen.raw(alone)[0] < calibration.screen_cut("rapidocr")
        second, second_raw = _second_stage(calibration, u, readers)
        if s.verdict == ir.Verdict.bounded:  # not read by all: the bound holds
            assert e.score <= s.score + 1e-12
            assert s.score < threshold or predicted or second_raw < cut
            if not (upper < threshold or predicted):
                read.add(id(u.crop))
        elif s.score == second:  # accepted by the second stage: at or over both thresholds
            assert s.verdict == ir.Verdict.scored and s.score >= max(early, threshold)
            read.add(id(u.crop))
        else:  # the decision the exact score makes, on a score that never overstates it
            assert s.verdict == ir.Verdict.scored
            assert s.score <= e.score + 1e-12
            assert (s.score >= threshold) == (e.score >= threshold)
            read.add(id(u.crop))
    by_name = {r.name: r for r in counting}
    assert by_name["tesseract"].crops == len(read)
    assert by_name["easyocr"].crops <= by_name["tesseract"].crops
    # RapidOCR's own candidates are not re-read by it: its posterior gives their evidence
    assert by_name["rapidocr"].read == 0
    assert unread  # the real lines the engine was sure of exercise the early accept


def _early(calibration, alone: np.ndarray) -> float:
    """The early accept's probability for a candidate's features before any re-read."""
    return float(calibration.early_calibration(calibration.early.raw(alone[None]))[0])


def _second_stage(calibration, u: Unit, readers) -> tuple[float, float]:
    """The second stage's probability and log-odds for a RapidOCR candidate: its features
    after every re-read but EasyOCR's."""
    value = ConsensusFeatures(SETTINGS, readers).compute([u], readers=("tesseract",))[0]
    raw = calibration.second.raw(value[None])
    return float(calibration.second_calibration(raw)[0]), float(raw[0])


def test_the_second_stage_decides_without_the_third_reader(readers) -> None:
    """Real lines as RapidOCR candidates, right and misread: EasyOCR reads exactly the
    crops the second stage leaves open; a crop it did not read was accepted at or over
    both thresholds, or sent to review under the cut (or decided by an exact bound)."""
    lines = _uw3(8)
    rng = random.Random(7)
    units = []
    for n, (image, truth) in enumerate(lines, start=1):
        changed = perturb(truth, rng) if n % 2 else None
        text = truth if changed is None else changed[1]
        units.append(unit(image, text, engine="rapidocr", n=n, confidence=0.97))
    for name in ("0383_010001", "0395_010064"):  # right lines the early accept leaves open
        image, truth = _uw3_line(name)
        units.append(unit(image, truth, engine="rapidocr", n=len(units) + 1, confidence=0.97))
    calibration = ConsensusScorer(SETTINGS, readers).calibration
    engine = calibration.threshold("rapidocr", "text")
    early, cut = calibration.second_stage("rapidocr")
    trees, platt = calibration.trees, calibration.calibration
    # What each unit's evidence says, whatever the threshold: (early, screened bound or
    # None, upper, lower, second, second's log-odds).
    evidence = []
    for u in units:
        alone = ConsensusFeatures(SETTINGS, readers).compute([u], readers=("tesseract",))[0]
        unread = ConsensusFeatures(SETTINGS, readers).compute([u], readers=())[0]
        screened = calibration.screen.raw(unread[None])[0] < calibration.screen_cut("rapidocr")
        bound = platt(trees.upper_raw(*(a[None] for a in optimistic(unread, "rapidocr"))))[0]
        evidence.append(
            (
                _early(calibration, unread),
                bound if screened else None,
                platt(
                    trees.upper_raw(*(a[None] for a in optimistic(alone, "rapidocr", ["easyocr"])))
                )[0],
                platt(
                    trees.lower_raw(*(a[None] for a in pessimistic(alone, "rapidocr", ["easyocr"])))
                )[0],
                *_second_stage(calibration, u, readers),
            )
        )
    accepted = sent = 0
    # The engine's threshold, and a region threshold stricter than it (a tenant's policy):
    # the early accept must reach that too, so right lines it would take alone are left
    # to the second stage.
    for threshold in (engine, max(engine, 0.995)):
        counting = [_Counting(r) for r in readers]
        scores = ConsensusScorer(SETTINGS, counting).score_against(units, lambda u, t=threshold: t)
        asked = 0
        for s, (right, bound, upper, lower, second, second_raw) in zip(
            scores, evidence, strict=True
        ):
            if right >= max(calibration.early_threshold("rapidocr"), threshold):
                assert s.verdict == ir.Verdict.scored and s.score == right
                continue  # accepted before any re-read
            if bound is not None:
                assert s.verdict == ir.Verdict.bounded and s.score == bound
                continue  # screened out before any re-read, at the best any re-read could give
            if s.verdict == ir.Verdict.bounded and s.score < threshold:
                continue  # out of reach before EasyOCR (first stage, or the exact bound)
            if lower >= threshold:
                assert s.verdict == ir.Verdict.scored and s.score == lower
            elif second >= max(early, threshold):
                assert s.verdict == ir.Verdict.scored and s.score == second
                accepted += 1
            elif second_raw < cut:
                assert s.verdict == ir.Verdict.bounded and s.score == upper
                sent += 1
            else:
                asked += 1
        by_name = {r.name: r for r in counting}
        assert by_name["easyocr"].crops == asked
    assert accepted and sent  # the real lines exercise both of the second stage's ways


def test_the_third_reader_is_asked_only_where_it_can_change_the_decision(readers) -> None:
    """With a threshold every agreeing line reaches whatever EasyOCR says, and one no line
    reaches whatever it says, EasyOCR reads nothing; what is not screened is decided as the
    full scorer decides it."""
    lines = _uw3(6)
    units = [
        unit(image, truth, engine="rapidocr", n=n, confidence=0.9999, word_confidence=0.9999)
        for n, (image, truth) in enumerate(lines, start=1)
    ]
    exact = ConsensusScorer(SETTINGS, readers).score(units)
    for limit in (1e-9, 1.0 - 1e-15):
        counting = [_Counting(r) for r in readers]
        scores = ConsensusScorer(SETTINGS, counting).score_against(
            units, lambda u, limit=limit: limit
        )
        by_name = {r.name: r for r in counting}
        assert by_name["easyocr"].crops == 0
        for s, e in zip(scores, exact, strict=True):
            if s.score < limit or s.verdict == ir.Verdict.scored:
                assert (s.score >= limit and s.verdict == ir.Verdict.scored) == (e.score >= limit)


def test_uncalibrated_kinds_and_shared_regions_are_screened_accordingly(readers) -> None:
    (image, truth), (image2, truth2) = _uw3(2)
    scorer = ConsensusScorer(SETTINGS, readers)
    alone = unit(image, truth, engine="rapidocr", n=1, confidence=0.9999)
    shared = [
        unit(image2, truth2, engine="rapidocr", n=2, confidence=0.55),
        unit(image2, truth2, engine="minicpm", n=2),
    ]
    scores = scorer.score_against([alone, *shared], lambda u: None)
    # no threshold: flagged `uncalibrated` whatever the re-read says, so it is not re-read;
    # a region with two candidates is re-read whatever: best-of-N compares exact scores
    assert [s.verdict for s in scores] == [ir.Verdict.bounded, ir.Verdict.scored, ir.Verdict.scored]


def test_the_trees_bound_every_value_a_free_feature_can_take() -> None:
    trees = load_calibration(WEIGHTS_PATH).trees
    rng = np.random.default_rng(5)
    x = rng.normal(scale=2.0, size=(300, len(FEATURE_NAMES)))
    none = np.zeros(len(FEATURE_NAMES), dtype=bool)
    assert np.allclose(trees.upper_raw(x, none), trees.raw(x))
    assert np.allclose(trees.lower_raw(x, none), trees.raw(x))
    free = rng.random((300, len(FEATURE_NAMES))) < 0.3
    upper, lower = trees.upper_raw(x, free), trees.lower_raw(x, free)
    assert (lower < upper).any()
    for draw in range(20):
        other = np.where(free, rng.normal(scale=3.0, size=x.shape), x)
        if draw % 5 == 0:
            other[free & (rng.random(x.shape) < 0.3)] = np.nan
        assert (trees.raw(other) <= upper + 1e-9).all()
        assert (trees.raw(other) >= lower - 1e-9).all()


# The ranges of the columns EasyOCR's evidence sets that are not shares in [0, 1].
RANGES = {
    "ctc_easyocr_mean_lp": (-20.0, 0.0),
    "ctc_easyocr_cand_lp": (-20.0, 0.0),
    "ctc_easyocr_cand_gap": (-50.0, 5.0),
    "ctc_rival_gap": (-50.0, 50.0),
}


def test_the_pessimistic_row_bounds_every_disagreeing_third_read() -> None:
    """`pessimistic` (a pending reader disagreeing as much as it can) under `lower_raw` is
    under the score of any reading that reader could give, and `optimistic` over it."""
    trees = load_calibration(WEIGHTS_PATH).trees
    rng = np.random.default_rng(11)
    names = list(FEATURE_NAMES)
    base = rng.random((200, len(names)))
    base[:, names.index("tesseract_missing")] = 0.0
    pending = ["easyocr"]
    touched = [n for n in names if n.startswith(("easyocr_", "ctc_easyocr_", "reread_", "agree"))]
    touched += ["rereads_agree", "ctc_rival_gap"]
    for row in base:
        before = row.copy()
        for name in touched:
            before[names.index(name)] = 0.0
        before[names.index("easyocr_missing")] = 1.0
        before[names.index("ctc_easyocr_missing")] = 1.0
        low_row, low_free = pessimistic(before, "rapidocr", pending)
        up_row, up_free = optimistic(before, "rapidocr", pending)
        lower = trees.lower_raw(low_row[None], low_free[None])[0]
        upper = trees.upper_raw(up_row[None], up_free[None])[0]
        after = before.copy()
        for name in touched:  # any reading EasyOCR could give, summaries consistent with it
            after[names.index(name)] = rng.random()
        for name, (least, most) in RANGES.items():
            after[names.index(name)] = rng.uniform(least, most)
        after[names.index("easyocr_missing")] = after[names.index("ctc_easyocr_missing")] = 0.0
        after[names.index("reread_count")] = 2.0
        after[names.index("reread_max_sim")] = max(
            after[names.index("reread_max_sim")], before[names.index("reread_max_sim")]
        )
        after[names.index("agree_word_share")] = max(
            after[names.index("agree_word_share")], before[names.index("agree_word_share")]
        )
        assert lower - 1e-9 <= trees.raw(after)[0] <= upper + 1e-9


def test_the_shipped_trees_are_monotone_where_the_bound_needs_it() -> None:
    """`features.optimistic` sets the increasing features to their largest value: valid only
    while raising one never lowers the score."""
    trees = load_calibration(WEIGHTS_PATH).trees
    rng = np.random.default_rng(9)
    x = rng.normal(scale=2.0, size=(300, len(FEATURE_NAMES)))
    for name in (*INCREASING, *DECREASING):
        column = FEATURE_NAMES.index(name)
        higher = x.copy()
        higher[:, column] += rng.random(300) * 3
        if name in INCREASING:
            assert (trees.raw(higher) >= trees.raw(x) - 1e-9).all(), name
        else:
            assert (trees.raw(higher) <= trees.raw(x) + 1e-9).all(), name
