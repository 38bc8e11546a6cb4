"""Region OCR engines and the recognise stage, on real pixels with the real engines."""

from __future__ import annotations

import logging
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from bench.corpus import SROIE, receipt_crops
from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.engines import base, describe_engines, load_detector, load_recognisers
from ocrfleet.engines.rapidocr import (
    DET_MODEL,
    DET_MODEL_INT8,
    DET_MODELS,
    MIN_WIDTH,
    REC_MODEL,
    REC_MODEL_INT8,
    RapidDetector,
    RapidRecogniser,
    detector_version,
    input_width,
    recogniser_version,
)
from ocrfleet.engines.tesseract import TesseractRecogniser, _shares, tesseract_version
from ocrfleet.metrics import cer
from ocrfleet.pipeline.recognise import recognise
from ocrfleet.pipeline.regions import detect_regions
from tests.conftest import REALDOCS
from tests.unit.synthetic import draw_page, line_image

LINES = [
    "The quick brown fox jumps over the lazy dog",
    "Invoice 2024-117: total due 1,250.00 EUR",
    "Pack my box with five dozen liquor jugs.",
    "short",
    "Sphinx of black quartz, judge my vow",
    "A much longer line of plain running text that goes on for quite a while",
    "42",
    "Email: someone@example.org",
]


@pytest.fixture(scope="module")
def rapid() -> RapidRecogniser:
    return RapidRecogniser(batch_size=16)


@pytest.fixture(scope="module")
def tess() -> TesseractRecogniser:
    return TesseractRecogniser()


@pytest.fixture(scope="module")
def detector() -> RapidDetector:
    return RapidDetector()


@pytest.fixture(scope="module")
def line_images() -> list[Image.Image]:
    return [line_image(text) for text in LINES]


@pytest.fixture(scope="module")
def page() -> tuple[Image.Image, list[str]]:
    texts = LINES[:5]
    image, _ = draw_page(
        (1000, 60 + 70 * len(texts)), [(40, 30 + 70 * i, t) for i, t in enumerate(texts)]
    )
    return image, texts


# --- RapidOCR ---------------------------------------------------------------------------------


def test_rapid_recogniser_reads_rendered_lines(rapid, line_images):
    readings = rapid.recognise(line_images)
    assert len(readings) == len(LINES)
    for (text, confidence), truth in zip(readings, LINES, strict=True):
        assert cer(text, truth) <= 0.05, (text, truth)
        assert confidence is not None and 0.5 < confidence <= 1.0


def test_rapid_batching_never_changes_a_reading(line_images):
    one_at_a_time = RapidRecogniser(batch_size=1)
    expected = [one_at_a_time.recognise([image])[0] for image in line_images]
    for batch_size in (1, 3, 16):
        assert RapidRecogniser(batch_size=batch_size).recognise(line_images) == expected
    order = list(range(len(line_images)))
    random.Random(7).shuffle(order)
    shuffled = RapidRecogniser(batch_size=3).recognise([line_images[i] for i in order])
    assert [shuffled[order.index(i)] for i in range(len(order))] == expected


def test_a_crop_is_read_at_its_own_width():
    for natural in range(1, 4000, 7):
        width = input_width(natural)
        assert width % 8 == 0 and width >= natural and width >= MIN_WIDTH
        assert width == MIN_WIDTH or width - natural < 8  # under one CTC frame of padding


def test_reading_at_its_own_width_beats_padding_to_320(monkeypatch):
    """Truth-box crops of real receipts (SROIE): padded to rapidocr's 320 columns the model
    drops spaces ("TaxCode", "Amt(RM)"); read at their own width, fewer crops are misread."""
    images = sorted((SROIE / "images").glob("*.jpg"))[::12]
    crops, texts = receipt_crops(images)
    truths = [" ".join(text.lower().split()) for text in texts]

    def errors(readings: list[tuple[str, float | None]]) -> int:
        pairs = zip(readings, truths, strict=True)
        return sum(" ".join(text.lower().split()) != truth for (text, _), truth in pairs)

    own = errors(RapidRecogniser().recognise(crops))
    monkeypatch.setattr("ocrfleet.engines.rapidocr.MIN_WIDTH", 320)
    padded = errors(RapidRecogniser().recognise(crops))
    assert len(crops) > 100 and own < padded, (own, padded)


def test_the_detector_input_is_rapidocrs_bit_for_bit(detector):
    """The normalisation through a table gives the float32 input rapidocr's own
    preprocessing gives, on a real scan, for the page detector and the windows' (no
    resizing)."""
    from rapidocr.ch_ppocr_det.utils import DetPreProcess

    scan = Image.open(REALDOCS / "tesseract_test" / "phototest.tif").convert("RGB")
    bgr = np.ascontiguousarray(np.asarray(scan)[:, :, ::-1])
    for det in (detector._det, detector._window_det):
        ours = det.get_preprocess()(bgr)
        theirs = DetPreProcess(det.limit_side_len, det.limit_type, det.mean, det.std)(bgr)
        assert ours.dtype == theirs.dtype == np.float32 and ours.shape == theirs.shape
        assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_rapid_recogniser_rejects_an_empty_crop(rapid):
    with pytest.raises(ValueError, match="empty image 0x30"):
        rapid.recognise([Image.new("RGB", (0, 30))])
    assert rapid.recognise([]) == []


def test_missing_model_is_a_clear_error_never_a_download(tmp_path):
    missing = tmp_path / DET_MODEL.name
    for build in (
        lambda: RapidDetector(model_path=missing),
        lambda: RapidRecogniser(model_path=missing),
        lambda: detector_version(missing),
    ):
        with pytest.raises(FileNotFoundError, match="never downloaded") as info:
            build()
        assert str(missing) in str(info.value)
    with pytest.raises(FileNotFoundError, match="OCRFLEET_DET_PRECISION=fp32"):
        RapidDetector(model_path=tmp_path / DET_MODEL_INT8.name)
    with pytest.raises(FileNotFoundError, match="OCRFLEET_REC_PRECISION=fp32"):
        RapidRecogniser(model_path=tmp_path / REC_MODEL_INT8.name)


def test_recognition_model_without_an_embedded_alphabet_is_refused():
    # rapidocr would fetch a dictionary file for such a model; we refuse it instead
    with pytest.raises(ValueError, match="alphabet"):
        RapidRecogniser(model_path=DET_MODEL)


def test_versions_are_stable_and_follow_the_model_bytes(tmp_path, rapid, detector):
    assert rapid.version == recogniser_version() == RapidRecogniser(batch_size=2).version
    assert detector.version == detector_version()
    assert rapid.version != detector.version
    copy = tmp_path / DET_MODEL_INT8.name
    shutil.copyfile(DET_MODEL_INT8, copy)
    assert detector_version(copy) == detector.version
    with copy.open("r+b") as fh:
        fh.seek(-1, 2)
        last = fh.read(1)
        fh.seek(-1, 2)
        fh.write(bytes([last[0] ^ 0xFF]))
    assert detector_version(copy) != detector.version


def test_rapidocr_does_not_log_at_info(capfd):
    RapidDetector()
    RapidRecogniser()
    assert logging.getLogger("RapidOCR").getEffectiveLevel() >= logging.WARNING
    assert "[INFO]" not in capfd.readouterr().err


def test_thread_setting_is_accepted_and_reads_the_same(rapid, line_images):
    assert RapidRecogniser(threads=1).recognise(line_images[:3]) == rapid.recognise(line_images[:3])


def test_calls_side_by_side_read_what_one_thread_reads():
    """Two threads are two one-thread model calls at once (`calls`): on real receipt lines
    every text, confidence and posterior equals a one-thread recogniser's."""
    crops, _ = receipt_crops(sorted((SROIE / "images").glob("*.jpg"))[:2])
    one, two = RapidRecogniser(threads=1), RapidRecogniser(threads=2)
    assert two._calls == 2
    keys = [str(i) for i in range(len(crops))]
    alone, side_by_side = one._read(crops, keys), two._read(crops, keys)
    assert len(crops) > 30
    for a, b in zip(alone, side_by_side, strict=True):
        assert a[:2] == b[:2]
        assert (a[3].log_probs == b[3].log_probs).all()


def test_runtimes_read_the_same_boxes_and_text_and_are_told_apart(monkeypatch, line_images):
    # onnxruntime by default; OpenVINO (the `openvino` extra) runs the same files. Their
    # outputs differ in the fifth decimal, so boxes and texts agree, but run_id does not.
    pytest.importorskip("openvino")
    from ocrfleet.engines.layout import LayoutDetector, layout_version

    page = Image.open(REALDOCS / "tesseract_test" / "phototest.tif").convert("RGB")
    read = {}
    for runtime in ("onnxruntime", "openvino"):
        monkeypatch.setattr(base, "RUNTIME", runtime)
        rec, det = RapidRecogniser(batch_size=16), RapidDetector()
        assert (rec.version, det.version) == (recogniser_version(), detector_version())
        blocks = LayoutDetector(det).blocks(page)
        read[runtime] = (
            {rec.version, det.version, layout_version()},
            [t for t, _ in rec.recognise(line_images)],
            [r.bbox for r in det.detect(page)],
            [(b.category, b.bbox) for b in blocks],
            [b.score for b in blocks],
        )
    (ort_versions, *ort_read, ort_scores), (ov_versions, *ov_read, ov_scores) = read.values()
    assert not ort_versions & ov_versions
    assert ort_read == ov_read
    assert ort_scores == pytest.approx(ov_scores, abs=1e-4)


# --- tesseract --------------------------------------------------------------------------------


def test_tesseract_reads_a_line(tess):
    [(text, confidence)] = tess.recognise([line_image(LINES[0])])
    assert cer(text, LINES[0]) < 0.1, text
    assert confidence is not None and 0.5 < confidence <= 1.0


def test_tesseract_gives_no_confidence_when_it_finds_no_word(tess):
    assert tess.recognise([Image.new("RGB", (2, 30), "white")]) == [("", None)]


def test_tesseract_batch_equals_one_at_a_time(tess, line_images):
    assert tess.recognise(line_images) == [tess.recognise([im])[0] for im in line_images]


def test_tesseract_processes_split_a_batch_without_changing_a_reading(line_images):
    batch = line_images * 2  # 16 crops: enough for 3 processes of at least 4 each
    one = TesseractRecogniser(processes=1).recognise_words(batch)
    assert TesseractRecogniser(processes=3).recognise_words(batch) == one


def test_tesseract_shares_balance_the_pixels_and_keep_every_crop():
    costs = [100, 1, 1, 1, 50, 50, 1, 1, 1, 1]
    shares = _shares(costs, 2)
    assert sorted(i for share in shares for i in share) == list(range(len(costs)))
    assert all(share == sorted(share) for share in shares)
    loads = sorted(sum(costs[i] for i in share) for share in shares)
    assert loads == [103, 104]
    assert _shares(costs, 8) == _shares(costs, 2)  # no process for fewer than 4 crops
    assert _shares([5, 5, 5], 4) == [[0, 1, 2]]


def test_tesseract_missing_language_or_binary_is_a_clear_error():
    with pytest.raises(ValueError, match="'klingon'.*not installed"):
        TesseractRecogniser(lang="eng+klingon")
    with pytest.raises(FileNotFoundError, match="not found on PATH"):
        TesseractRecogniser(cmd="no-such-tesseract-binary")


def test_tesseract_version_names_release_and_language(tess):
    assert tess.version == tesseract_version("eng")
    assert tess.version.split("+")[0][0].isdigit()
    assert tesseract_version("chi_sim") != tess.version


# --- the recognise stage ----------------------------------------------------------------------


def test_every_engine_reads_every_region(page, detector, rapid, tess):
    image, texts = page
    regions = detect_regions(image, detector)
    candidates = recognise(image, regions, [rapid, tess])
    assert [(c.region_number, c.engine) for c in candidates] == [
        (r.number, name) for r in regions for name in ("rapidocr", "tesseract")
    ]
    for engine in ("rapidocr", "tesseract"):
        read = [c.text for c in candidates if c.engine == engine]
        assert cer("\n".join(read), "\n".join(texts)) < 0.05, read
        assert all(c.error is None for c in candidates)


def test_engine_batch_size_does_not_change_candidates(page, detector, tess):
    image, _ = page
    regions = detect_regions(image, detector)
    one = recognise(image, regions, [RapidRecogniser(batch_size=1), tess])
    assert recognise(image, regions, [RapidRecogniser(batch_size=3), tess]) == one
    assert recognise(image, regions, [RapidRecogniser(batch_size=64), tess]) == one


def test_a_crop_an_engine_cannot_read_costs_that_region_only(page, detector, rapid, tess):
    image, _ = page
    good = detect_regions(image, detector)
    # a real degenerate region: zero width, so both engines raise on its crop
    flat = ir.Region(number=len(good) + 1, bbox=ir.BBox(x0=50, y0=40, x1=50, y1=80))
    candidates = recognise(image, [*good, flat], [rapid, tess])
    bad = [c for c in candidates if c.region_number == flat.number]
    assert [c.engine for c in bad] == ["rapidocr", "tesseract"]
    for c in bad:
        assert c.text == "" and c.confidence is None
        assert c.error is not None and "empty image 0x40" in c.error
    rest = [c for c in candidates if c.region_number != flat.number]
    assert rest == recognise(image, good, [rapid, tess])


def test_stage_rejects_bad_arguments(page, rapid):
    image, _ = page
    with pytest.raises(ValueError, match="batch_size"):
        RapidRecogniser(batch_size=0)
    with pytest.raises(ValueError, match="unique"):
        recognise(image, [], [rapid, rapid])


# --- loading by settings ----------------------------------------------------------------------


def test_engines_load_by_name_in_settings_order():
    settings = Settings(
        engines=["tesseract", "rapidocr"], rec_batch_size=5, layout="rapid", engine_timeout_s=30
    )
    recognisers = load_recognisers(settings)
    assert [r.name for r in recognisers] == ["tesseract", "rapidocr"]
    assert recognisers[1].batch_size == 5
    detector = load_detector(settings)
    described = describe_engines(settings)
    assert described == {
        "detector": {"name": "rapid-layout", "version": detector.version},
        "mode": "best_of_n",
        "timeout_s": 30,
        "recognisers": [{"name": r.name, "version": r.version} for r in recognisers],
    }
    lines = load_detector(Settings(layout="lines"))
    assert describe_engines(Settings(layout="lines"))["detector"] == {
        "name": "rapidocr",
        "version": lines.version,
    }


def test_detector_precision_picks_the_model_and_enters_the_run():
    int8, fp32 = (
        load_detector(Settings(layout="lines", det_precision=p)) for p in ("int8", "fp32")
    )
    assert (int8.version, fp32.version) == (detector_version(), detector_version(DET_MODEL))
    assert int8.version != fp32.version
    assert describe_engines(Settings(layout="lines"))["detector"]["version"] == int8.version
    described = describe_engines(Settings(layout="lines", det_precision="fp32"))
    assert described["detector"]["version"] == fp32.version
    never = load_detector(Settings(layout="lines", det_text_height=0))
    assert never._text_height == 0  # type: ignore[attr-defined]
    assert never.version == detector_version(text_height=0) != int8.version
    described = describe_engines(Settings(layout="lines", det_text_height=0))
    assert described["detector"]["version"] == never.version


def test_recogniser_precision_picks_the_model_and_enters_the_run():
    int8, fp32 = (
        load_recognisers(Settings(engines=["rapidocr"], rec_precision=p))[0]
        for p in ("int8", "fp32")
    )
    assert (int8.version, fp32.version) == (recogniser_version(), recogniser_version(REC_MODEL))
    assert int8.version != fp32.version
    described = describe_engines(Settings(engines=["rapidocr"]))
    assert described["recognisers"] == [{"name": "rapidocr", "version": int8.version}]
    described = describe_engines(Settings(engines=["rapidocr"], rec_precision="fp32"))
    assert described["recognisers"] == [{"name": "rapidocr", "version": fp32.version}]


def test_the_int8_recogniser_quantises_its_backbone_only_and_reads_as_fp32_reads():
    """The SVTR neck and the output layer stay float (int8 lost most there); on book lines,
    out of the calibration's domain (receipts), int8 makes about as many errors as fp32."""
    import onnx

    graph = onnx.load(str(REC_MODEL_INT8)).graph
    pool = next(i for i, node in enumerate(graph.node) if node.op_type == "AveragePool")
    before, after = ({n.op_type for n in part} for part in (graph.node[:pool], graph.node[pool:]))
    assert "DequantizeLinear" in before and "DequantizeLinear" not in after
    lines = sorted((REALDOCS / "uw3_500_ocropy" / "lines").glob("*.png"))
    if not lines:
        pytest.skip(f"no real documents under {REALDOCS} (set OCRFLEET_REALDOCS)")
    crops = [Image.open(p).convert("RGB") for p in lines]
    truths = [p.with_name(p.name.replace(".png", ".gt.txt")).read_text().strip() for p in lines]
    int8, fp32 = (
        [text for text, _ in RapidRecogniser(model, threads=1).recognise(crops)]
        for model in (REC_MODEL_INT8, REC_MODEL)
    )
    changed = sum(a != b for a, b in zip(int8, fp32, strict=True))
    assert 0 < changed <= 0.1 * len(crops), changed
    mean_int8, mean_fp32 = (
        sum(cer(text, truth) for text, truth in zip(read, truths, strict=True)) / len(crops)
        for read in (int8, fp32)
    )
    assert mean_int8 <= 1.1 * mean_fp32, (mean_int8, mean_fp32)  # 0.0128 against 0.0124


def test_the_int8_detector_is_quantised_and_finds_the_lines_fp32_finds():
    # Quantisation moves a box's ends by a few pixels and now and then splits a line at a
    # word gap the other keeps (3 of 118 lines on 8087); the ink the two cover is the same.
    import onnx

    ops = {node.op_type for node in onnx.load(str(DET_MODEL_INT8)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    folder = REALDOCS / "tesseract_test"
    if not folder.is_dir():
        pytest.skip(f"no real documents under {REALDOCS} (set OCRFLEET_REALDOCS)")
    for name in ("phototest.tif", "8087_054.3B.tif"):
        page = Image.open(folder / name).convert("RGB")
        int8, fp32 = ([r.bbox for r in RapidDetector(m).detect(page)] for m in DET_MODELS.values())
        assert abs(len(int8) - len(fp32)) <= 0.05 * len(fp32), name
        for ours, theirs in ((int8, fp32), (fp32, int8)):
            covered = [box for box in ours if _covered(box, theirs) >= 0.8]
            assert len(covered) >= 0.95 * len(ours), name


@pytest.mark.parametrize("shade", [0, 128, 230, 255])
def test_a_page_of_one_colour_has_no_lines(shade):
    # The int8 model is not calibrated for a flat input: it drew boxes on a plain 400 x 300
    # page until the detector stopped running it on one.
    for model in DET_MODELS.values():
        for size in ((400, 300), (1700, 2200)):
            assert RapidDetector(model).detect(Image.new("RGB", size, (shade,) * 3)) == []


def _covered(box: ir.BBox, others: list[ir.BBox]) -> float:
    """The share of `box` under `others` (a detector's boxes barely overlap each other)."""
    inside = 0
    for other in others:
        w = min(box.x1, other.x1) - max(box.x0, other.x0)
        h = min(box.y1, other.y1) - max(box.y0, other.y0)
        inside += max(0, w) * max(0, h)
    return min(1.0, inside / max(1, (box.x1 - box.x0) * (box.y1 - box.y0)))


def test_tesseract_language_comes_from_settings():
    [rec] = load_recognisers(Settings(engines=["tesseract"], tesseract_lang="chi_sim"))
    assert rec.lang == "chi_sim"
    with pytest.raises(ValueError, match="not installed"):
        load_recognisers(Settings(engines=["tesseract"], tesseract_lang="nope"))


def test_minicpm_says_what_it_needs(tmp_path):
    from ocrfleet.checkpoints import CheckpointError

    for path in (None, tmp_path / "missing", tmp_path):
        settings = Settings(engines=["minicpm"], minicpm_model_path=path)
        for call in (load_recognisers, describe_engines):
            with pytest.raises(CheckpointError, match="OCRFLEET_MINICPM_MODEL_PATH"):
                call(settings)


# --- real documents ---------------------------------------------------------------------------


def test_phototest_page_reads_with_low_error(detector, rapid, tess):
    folder = REALDOCS / "tesseract_test"
    if not folder.is_dir():
        pytest.skip(f"no real documents under {REALDOCS} (set OCRFLEET_REALDOCS)")
    image = Image.open(folder / "phototest.tif").convert("RGB")
    truth = (folder / "phototest.txt").read_text(encoding="utf-8")
    regions = detect_regions(image, detector)
    candidates = recognise(image, regions, [rapid, tess])
    for engine in ("rapidocr", "tesseract"):
        text = "\n".join(c.text for c in candidates if c.engine == engine)
        assert cer(text, truth) < 0.10, (engine, text)


def test_rapidocr_parses_its_model_catalogue_once() -> None:
    # A fresh process: what matters is the order of a real one's first imports.
    probe = (
        "import ocrfleet.engines.rapidocr\n"
        "from rapidocr.inference_engine.base import InferSession\n"
        "from rapidocr.utils import model_resolver\n"
        "print(model_resolver._MODEL_CONFIG is InferSession.model_info,"
        " 'model_routes' in InferSession.model_info)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True"]
