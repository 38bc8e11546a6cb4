"""RapidOCR (PP-OCR ONNX models, CPU) split into its two stages: the text-line detector and
the line recogniser, so detection runs once per page and recognition runs batched over the
crops that every other engine and scorer also sees.

The models run on onnxruntime sessions we build ourselves, or on OpenVINO where the
`openvino` extra is installed (`engines.base.RUNTIME`: faster model calls, slower load, more
memory). Either way the model files are the ones inside the rapidocr wheel, named by path,
and rapidocr's TextDetector / TextRecognizer keep their pre- and post-processing (and
upstream defaults) while their download path stays unreachable: a missing model is a
FileNotFoundError at construction, never a download. The runtime and its version enter each
model's version, so run_id says which one read a page.

The recogniser also gives each crop's CTC posterior (`ocrfleet.scorers.ctc.Posterior`):
`posteriors(crops)` for any crops, and every `recognise`/`recognise_words` call keeps the
posteriors of what it read in `ctc.RECENT`, so the consensus scorer gets the primary
engine's character evidence from the model call that read the page, not from a second one.

Not used: rapidocr's text-line orientation classifier (on by default in its full
pipeline; it turns lines it reads as upside down). Our regions are axis-aligned crops of
upright pages; on the 264 detected lines of the realdocs tesseract_test pages it would have
turned one crop, an 18x18 px speck, and it costs a model call per line.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
from collections.abc import Sequence
from functools import lru_cache, partial
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any, NoReturn

from ocrfleet.engines import catalogue  # noqa: F401  (before rapidocr: one parse of its catalogue)

# isort: split
import cv2
import numpy as np
import onnxruntime as ort
from omegaconf import DictConfig, flag_override
from PIL import Image
from rapidocr.cal_rec_boxes.main import CalRecBoxes
from rapidocr.ch_ppocr_det import TextDetector
from rapidocr.ch_ppocr_rec import TextRecognizer
from rapidocr.main import DEFAULT_CFG_PATH
from rapidocr.utils.parse_parameters import ParseParams
from rapidocr.utils.process_img import (
    apply_vertical_padding,
    map_boxes_to_original,
    resize_image_within_bounds,
)
from rapidocr.utils.typings import EngineType

from ocrfleet import (
    ir,
    offline,  # noqa: F401, I001  (telemetry off before onnxruntime loads)
)
from ocrfleet.engines import base, calls
from ocrfleet.engines.normalise import TablePreprocess
from ocrfleet.memory import release_memory
from ocrfleet.pipeline import tiles
from ocrfleet.pipeline.regions import order_regions, polygon_bbox
from ocrfleet.scorers import ctc

MODEL_DIR = Path(DEFAULT_CFG_PATH).parent / "models"
DET_MODEL = MODEL_DIR / "PP-OCRv6_det_small.onnx"
REC_MODEL = MODEL_DIR / "PP-OCRv6_rec_small.onnx"
# DET_MODEL quantised to int8 (static, per channel, calibrated on receipts only), built by
# `scripts/quantize_models.py det`: 0.74x the detector's time on 40 real pages of four kinds,
# with the same word recall (issue 20). The default; `OCRFLEET_DET_PRECISION=fp32` reads with
# DET_MODEL.
DET_MODEL_INT8 = Path(__file__).parent / "models" / "PP-OCRv6_det_small.int8.onnx"
DET_MODELS = {"int8": DET_MODEL_INT8, "fp32": DET_MODEL}
# REC_MODEL with its backbone's convolutions in int8 (the neck and output layer float) and
# its GELUs fused, built by `scripts/quantize_models.py rec`: 0.5-0.6x the model's time with
# the same character errors (README, "CPU cost per page"), and 0.77-0.83x that again with the
# GELUs fused (the same posteriors, bit for bit). The default, and what the consensus
# verifier is fitted on; `OCRFLEET_REC_PRECISION=fp32` reads with REC_MODEL.
REC_MODEL_INT8 = Path(__file__).parent / "models" / "PP-OCRv6_rec_small.int8.onnx"
REC_MODELS = {"int8": REC_MODEL_INT8, "fp32": REC_MODEL}
# A crop is read at its own width, rounded up to whole CTC frames (one per WIDTH_STEP
# columns) and to at least MIN_WIDTH, not padded to rapidocr's 320 or to a shared bucket:
# padding changes what this model reads (it dropped spaces between words) and costs time.
# On the truth-box crops of 20 SROIE receipts, CER 0.0261 padded to width buckets (x1.25
# from 320), 0.0245 at min 320, 0.0239 at min 160, 0.0240 at min 96, with 0.77x the model
# time at min 160 and 0.62x at min 96; 100 UW3 lines read the same but for 2 (issue 20,
# `bench/rec_width.py`).
WIDTH_STEP = 8
MIN_WIDTH = 96
# Crops per model call are capped so that one call's input stays under this many columns:
# a call takes ~27 MB per 1,000 columns (its output alone holds 18,710 classes per frame, a
# frame per 8 columns), and larger batches are no faster per crop on a CPU (0.04-0.05 s per
# 320 px crop at 1 to 16 crops a call). Which crops share a call does not change what each
# reads (see `RapidRecogniser`).
WIDTH_BUDGET = 4 * 320
# Detection at the scale the page's text needs: a survey of the page at SURVEY_PIXELS
# finds its lines, and the page is read at the scale that makes the TEXT_QUANTILE of their
# heights TEXT_HEIGHT px (`OCRFLEET_DET_TEXT_HEIGHT`), never above the scale rapidocr's own
# preprocessing gives it, and only on a page that scale shrinks; where the survey already
# sees them that tall (within SURVEY_SLACK), its boxes are the page's. On 36 real pages (20
# receipts, 12 olmOCR pages, 4 tesseract_test): 0.62x the detector's time, 0.87x the page's,
# word recall 0.9361 against 0.9338 (receipts the same, olmOCR +0.020; issue 20,
# `bench/det_side.py`). At 20 px, or on receipt photos read at their own size, receipts lost
# words: the wide gaps in their lines close at a smaller scale.
SURVEY_PIXELS = 500_000
SURVEY_GAIN = 0.8  # a survey, or a new scale, only at most this share of the page's scale
SURVEY_LINES = 4  # fewer lines found: no survey (a page of a few lines, or of tiny text)
SURVEY_SLACK = 1.15
TEXT_QUANTILE = 0.1
TEXT_HEIGHT = 28
# Detection pixels from a window's edge within which a box counts as cut by it.
SEAM_MARGIN = 4
# rapidocr's detection settings that change boxes; their values come from its config.yaml.
_DET_KEYS = (
    "limit_side_len",
    "limit_type",
    "mean",
    "std",
    "thresh",
    "box_thresh",
    "max_candidates",
    "unclip_ratio",
    "use_dilation",
    "score_mode",
)


def _quiet_rapidocr() -> None:
    """RapidOCR logs every model load at INFO on its own non-propagating logger."""
    logging.getLogger("RapidOCR").setLevel(logging.WARNING)


def _missing(model: Path) -> NoReturn:
    shipped = {DET_MODEL_INT8.name: "DET", REC_MODEL_INT8.name: "REC"}
    if model.name in shipped:
        raise FileNotFoundError(
            f"RapidOCR model file {model} is missing. The int8 models ship inside the "
            "ocrfleet package and are never downloaded at run time: reinstall ocrfleet, "
            "rebuild it with scripts/quantize_models.py, or set "
            f"OCRFLEET_{shipped[model.name]}_PRECISION=fp32."
        )
    raise FileNotFoundError(
        f"RapidOCR model file {model} is missing. The models ship inside the rapidocr "
        f"wheel (rapidocr=={package_version('rapidocr')}) and are never downloaded at run "
        "time: reinstall rapidocr, or pass the path of a local copy."
    )


def _session(model: Path, threads: int | None) -> ort.InferenceSession:
    if not model.is_file():
        _missing(model)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = False  # as rapidocr does: page sizes vary a lot
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads is not None:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(
        str(model), sess_options=options, providers=["CPUExecutionProvider"]
    )


def _config(section: str, model: Path, threads: int | None) -> DictConfig:
    """rapidocr's own defaults, with `model` in `section` run on `RUNTIME` instead of a model
    lookup: an onnxruntime session of ours, or rapidocr's OpenVINO session on the file."""
    if not model.is_file():
        _missing(model)
    cfg = ParseParams.load(DEFAULT_CFG_PATH)
    stage = cfg[section]
    if base.RUNTIME == "openvino":
        engine = cfg.EngineConfig.openvino
        engine.inference_num_threads = min(threads, os.cpu_count() or 1) if threads else -1
        engine.performance_hint = "LATENCY"  # one request at a time, all threads on it
        stage.engine_type = EngineType.OPENVINO
        stage.model_path = str(model)
        stage.engine_cfg = engine
    else:
        with flag_override(stage, "allow_objects", True):
            stage.session = _session(model, threads)
    stage.font_path = None
    return cfg


def _has_alphabet(stage: DictConfig) -> bool:
    """Whether the stage's recognition model embeds its 'character' alphabet (ONNX
    metadata): without it rapidocr's TextRecognizer would fetch a dictionary file."""
    if stage.engine_type == EngineType.OPENVINO:
        import openvino

        info = openvino.Core().read_model(stage.model_path).get_rt_info()
        return "framework" in info and "character" in info["framework"]
    return "character" in stage.session.get_modelmeta().custom_metadata_map


def _runtime() -> str:
    """The runtime and its version, as they enter the models' versions."""
    return f"{base.RUNTIME} {package_version(base.RUNTIME)}"


@lru_cache(maxsize=8)
def _file_sha256(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _version(model: Path, params: dict[str, Any]) -> str:
    """`<rapidocr version>+<hash of the model's sha256 and our params>`: enters run_id."""
    if not model.is_file():
        _missing(model)
    stat = model.stat()
    rapid = package_version("rapidocr")
    blob = json.dumps(
        {
            "rapidocr": rapid,
            "model": model.name,
            "sha256": _file_sha256(model, stat.st_size, stat.st_mtime_ns),
            "params": params,
        },
        sort_keys=True,
        default=str,
    )
    return f"{rapid}+{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _det_params(root: DictConfig, text_height: int) -> dict[str, Any]:
    g, det = root.Global, root.Det
    params = {k: g[k] for k in ("min_side_len", "max_side_len", "width_height_ratio", "min_height")}
    params["runtime"] = _runtime()
    for key in _DET_KEYS:
        params[key] = det[key]
    params["tiles"] = {
        "min_scale": tiles.MIN_SCALE,
        "max_pixels": tiles.MAX_PIXELS,
        "min_window": tiles.MIN_WINDOW,
        "seam_margin": SEAM_MARGIN,
        "overlap": tiles.OVERLAP,
        "max_aspect": tiles.MAX_ASPECT,
        "same_text": tiles.SAME_TEXT,
        "same_line": tiles.SAME_LINE,
        "overlap_x": tiles.OVERLAP_X,
        "sliver_rule": tiles.SLIVER_RULE,
    }
    if text_height:
        params["survey"] = {
            "pixels": SURVEY_PIXELS,
            "gain": SURVEY_GAIN,
            "lines": SURVEY_LINES,
            "slack": SURVEY_SLACK,
            "quantile": TEXT_QUANTILE,
            "text_height": text_height,
        }
    return json.loads(json.dumps(params, default=list))


def _min_short(det: DictConfig) -> int:
    """The least short side rapidocr's detector reads a page at: with limit_type 'min' it
    scales a shorter one up to limit_side_len."""
    return int(det.limit_side_len) if det.limit_type == "min" else 0


def _tabled(det: TextDetector) -> TextDetector:
    """`det`, its preprocessing normalised through a table (`normalise.TablePreprocess`:
    the same input, bit for bit). rapidocr makes a new one from the detector's settings
    for every call; this one is made once, from its settings now."""
    pre = TablePreprocess(TextDetector.get_preprocess(det))
    det.get_preprocess = lambda: pre
    return det


def _native(det: TextDetector) -> TextDetector:
    """`det` (the same session) without its resizing, for windows already at detection
    scale: a window lower than limit_side_len would otherwise be scaled up, and read at
    another scale than the page."""
    native = copy.copy(det)
    native.limit_type, native.limit_side_len = "max", math.inf
    return _tabled(native)


def _rec_params(root: DictConfig) -> dict[str, Any]:
    return {
        "rec_img_shape": list(root.Rec.rec_img_shape),
        "width_step": WIDTH_STEP,
        "min_width": MIN_WIDTH,
        "use_cls": False,
        "runtime": _runtime(),
    }


@lru_cache(maxsize=1)
def _defaults() -> DictConfig:
    """rapidocr's default configuration, parsed once, to read a version's parameters from
    (run_id asks for them twice a run); `_config` parses a copy of its own to edit."""
    return ParseParams.load(DEFAULT_CFG_PATH)


def detector_version(model_path: Path = DET_MODEL_INT8, text_height: int = TEXT_HEIGHT) -> str:
    """The detector's version without loading the model (for run_id)."""
    return _version(Path(model_path), _det_params(_defaults(), text_height))


def recogniser_version(model_path: Path = REC_MODEL_INT8) -> str:
    """The recogniser's version without loading the model (for run_id)."""
    return _version(Path(model_path), _rec_params(_defaults()))


def release_stage(stage: Any) -> None:
    """Free a stage's activations after a page: OpenVINO keeps them in the infer request for
    the next call (~0.9 GB after a 2000 px detection; onnxruntime frees its own)."""
    request = getattr(getattr(stage, "session", None), "session", None)
    if hasattr(request, "get_compiled_model"):
        request.get_compiled_model().release_memory()


def _scaled(array: np.ndarray, scale: float) -> tuple[np.ndarray, float, float]:
    """A page resampled as rapidocr resamples one for its detector (bilinear, each side
    rounded to a multiple of 32, which the detector needs), with the ratios (x, y) of its
    sides to the page's: a window cut from it on multiples of 32 is detected on exactly the
    pixels a whole-page pass would see."""
    height, width = array.shape[:2]
    size = (_multiple_of_32(width * scale), _multiple_of_32(height * scale))
    if size != (width, height):
        array = cv2.resize(array, size)
    return array, size[0] / width, size[1] / height


def _multiple_of_32(length: float) -> int:
    """rapidocr's rounding of a side; a side under 32 px (a thin strip) is kept, and its
    windows padded instead (`tiles.padding`)."""
    return max(1, int(length)) if length < 32 else round(int(length) / 32) * 32


def _to_bgr(image: Image.Image) -> np.ndarray:
    if image.width == 0 or image.height == 0:
        raise ValueError(f"empty image {image.width}x{image.height}: nothing to read")
    rgb = np.asarray(image.convert("RGB"))
    return np.ascontiguousarray(rgb[:, :, ::-1])


class RapidDetector:
    """Text-line detector (PP-OCR DB). Regions come back as clipped axis-aligned boxes in
    reading order. A page the detector takes whole gets rapidocr's own page preprocessing
    (long side capped at 2000 px, vertical padding of very wide images) as in its full
    pipeline; a page over `tiles.MAX_PIXELS` at that scale (its memory), over twice that
    size, or a strip too thin or too tall for it, is detected on the windows of
    `ocrfleet.pipeline.tiles` instead. With a `text_height`, a page whose text is taller
    than it needs is read at a smaller scale, found by a survey (SURVEY_PIXELS); 0: never.
    `last_plan` is how the last `detect` call covered its page."""

    name = "rapidocr"

    def __init__(
        self,
        model_path: Path = DET_MODEL_INT8,
        threads: int | None = None,
        text_height: int = TEXT_HEIGHT,
    ) -> None:
        _quiet_rapidocr()
        root = _config("Det", Path(model_path), threads)
        g = root.Global
        self._det = _tabled(TextDetector(root.Det))
        self._window_det = _native(self._det)
        self._min_side, self._max_side = int(g.min_side_len), int(g.max_side_len)
        self._min_short = _min_short(root.Det)
        self._max_pixels = tiles.MAX_PIXELS
        self._pad_ratio, self._pad_min_h = float(g.width_height_ratio), float(g.min_height)
        self._text_height = text_height
        self.last_plan: ir.DetectionPlan | None = None
        self.version = _version(Path(model_path), _det_params(root, text_height))

    def release_memory(self) -> None:
        """Drop what the model keeps between pages (see `release_stage`)."""
        release_stage(self._det)

    def _plan(
        self, width: int, height: int, scale: float | None = None
    ) -> tuple[ir.DetectionPlan, list[ir.BBox]]:
        return tiles.plan(
            width,
            height,
            self._max_side,
            self._min_side,
            self._max_pixels,
            self._min_short,
            self._pad_ratio,
            scale,
        )

    def detect(self, page: Image.Image) -> list[ir.Region]:
        original = _to_bgr(page)
        plan, windows = self._plan(page.width, page.height)
        found = None
        survey = self._survey(original, plan.scale) if self._text_height else None
        if survey is not None:
            needed, surveyed, survey_windows, survey_found = survey
            if needed <= surveyed.scale * SURVEY_SLACK:
                plan, windows, found = surveyed, survey_windows, survey_found
            elif needed <= SURVEY_GAIN * plan.scale:
                plan, windows = self._plan(page.width, page.height, needed)
        if found is None and plan.method == "whole" and not self._odd_shape(*page.size, plan.scale):
            found = [(0, bbox, score) for bbox, score in self._detect_array(original)]
        elif found is None:
            scaled, ratio_x, ratio_y = _scaled(original, plan.scale)
            del original  # the page's pixels at detection scale are all the windows need
            found = self._windows(scaled, ratio_x, ratio_y, windows)
        self.last_plan = plan
        regions = []
        if len(windows) > 1:
            found = tiles.finer(tiles.seam_slivers(found, windows, SEAM_MARGIN / plan.scale))
        for bbox, score in tiles.merge(found, windows):
            bbox = polygon_bbox([(bbox.x0, bbox.y0), (bbox.x1, bbox.y1)], page.width, page.height)
            if bbox is not None:
                regions.append(ir.Region(number=1, bbox=bbox, det_score=score))
        return order_regions(regions)

    def _windows(
        self, scaled: np.ndarray, ratio_x: float, ratio_y: float, windows: list[ir.BBox]
    ) -> list[tuple[int, ir.BBox, float]]:
        """(window index, box in page pixels, score) over the windows of a scaled page."""
        found = []
        for index, window in enumerate(windows):
            for bbox, score in self._detect_window(scaled, window, ratio_x, ratio_y):
                found.append((index, bbox, score))
        return found

    def _survey(
        self, original: np.ndarray, scale: float
    ) -> tuple[float, ir.DetectionPlan, list[ir.BBox], list[tuple[int, ir.BBox, float]]] | None:
        """The page read at SURVEY_PIXELS: the scale its smaller lines need (their
        TEXT_QUANTILE height made `_text_height` px, at most `scale`), with the survey's plan
        and boxes. None for a page `scale` does not shrink, where a survey would not be much
        cheaper than the page's own pass, or where it finds fewer than SURVEY_LINES lines (a
        page of a few lines, or of text too small to see at survey scale: read at
        `scale`)."""
        height, width = original.shape[:2]
        survey = math.sqrt(SURVEY_PIXELS / (width * height))
        strip = max(width, height) > tiles.MAX_ASPECT * min(width, height)
        if scale >= 1.0 or survey > SURVEY_GAIN * scale or strip:
            # A page read at or above its own size has no pixels to spare (a phone photo of
            # a receipt: at a smaller scale the gaps in its lines close), and a strip is
            # padded to the detector's aspect, so no survey of it is cheap.
            return None
        plan, windows = self._plan(width, height, survey)
        found = self._windows(*_scaled(original, survey), windows)
        if len(found) < SURVEY_LINES:
            return None
        heights = np.array([bbox.y1 - bbox.y0 for _, bbox, _ in found], dtype=float)
        text = float(np.quantile(heights, TEXT_QUANTILE))
        return min(scale, self._text_height / max(text, 1.0)), plan, windows, found

    def _odd_shape(self, width: int, height: int, scale: float) -> bool:
        """A shape rapidocr's own preprocessing cannot take: a short side under its minimum
        after scaling (it would scale the long side up without bound), or a tall strip (it
        pads only wide ones)."""
        return min(width, height) * scale < self._min_side or height > tiles.MAX_ASPECT * width

    def _detect_window(
        self, scaled: np.ndarray, window: ir.BBox, ratio_x: float, ratio_y: float
    ) -> list[tuple[ir.BBox, float]]:
        """One window of the page, cut on multiples of 32 from the page as `_scaled`
        resampled it (so every window sees the pixels a whole-page pass would): boxes in
        page pixels."""
        height, width = scaled.shape[:2]
        x0, y0 = 32 * int(window.x0 * ratio_x // 32), 32 * int(window.y0 * ratio_y // 32)
        x1 = min(width, 32 * math.ceil(window.x1 * ratio_x / 32))
        y1 = min(height, 32 * math.ceil(window.y1 * ratio_y / 32))
        crop = scaled[y0:y1, x0:x1]
        if _one_colour(crop):
            return []
        right, bottom = tiles.padding(crop.shape[1], crop.shape[0], self._min_side)
        right += -(crop.shape[1] + right) % 32  # the detector's input sides are multiples of 32
        bottom += -(crop.shape[0] + bottom) % 32
        if right or bottom:
            crop = cv2.copyMakeBorder(
                crop, 0, bottom, 0, right, cv2.BORDER_CONSTANT, value=(255, 255, 255)
            )
        found = []
        for bbox, score in self._detect_array(crop, native=True):
            mapped = polygon_bbox(
                [
                    ((x0 + bbox.x0) / ratio_x, (y0 + bbox.y0) / ratio_y),
                    ((x0 + bbox.x1) / ratio_x, (y0 + bbox.y1) / ratio_y),
                ],
                window.x1,
                window.y1,
            )
            if mapped is not None:
                found.append((mapped, score))
        return found

    def _detect_array(self, image: np.ndarray, native: bool = False) -> list[tuple[ir.BBox, float]]:
        """rapidocr's page preprocessing and detector on one BGR array, or with `native` the
        detector alone on a window at detection scale: boxes in its pixels."""
        height, width = image.shape[:2]
        if _one_colour(image):
            return []
        record: dict[str, Any] = {"preprocess": {"ratio_h": 1.0, "ratio_w": 1.0}}
        img, det = image, self._window_det
        if not native:
            img, ratio_h, ratio_w = resize_image_within_bounds(
                image, self._min_side, self._max_side
            )
            record = {"preprocess": {"ratio_h": ratio_h, "ratio_w": ratio_w}}
            img, record = apply_vertical_padding(img, record, self._pad_ratio, self._pad_min_h)
            det = self._det
        # The heap goes back to the system before each detector call: its activations are
        # mapped afresh, so what the page's earlier stages (and the previous band) freed
        # would otherwise add to the detector's peak instead of being reused.
        release_memory()
        result = det(img)
        if result.boxes is None or len(result.boxes) == 0:
            return []
        polygons = map_boxes_to_original(
            np.asarray(result.boxes, dtype=np.float32), record, height, width
        )
        found = []
        for polygon, score in zip(polygons, result.scores, strict=True):
            bbox = polygon_bbox(polygon.tolist(), width, height)
            if bbox is not None:
                found.append((bbox, float(score)))
        return found


def _one_colour(array: np.ndarray) -> bool:
    """Whether every pixel is alike: no text to find, and the int8 detector, which never saw
    a flat input in its calibration's ranges, drew boxes on some (a black 400 x 300 page)."""
    return bool(array.size) and array.min() == array.max()


def input_width(natural: int) -> int:
    """The model input width of a crop whose height-normalised width is `natural`."""
    return max(MIN_WIDTH, -(-natural // WIDTH_STEP) * WIDTH_STEP)


class RapidRecogniser:
    """Text-line recogniser (PP-OCR CTC), batched so that batching cannot change the text.

    rapidocr's own batching pads every crop of a batch to the widest one, and padding
    changes what this model reads (7 of 264 realdocs lines read differently at batch size 1
    and 16). Here each crop is resized to the model height and read at its own width
    (`input_width`); only crops of the same input width share a model call (`batch_size`
    of them, fewer for wide ones, `WIDTH_BUDGET`), so a crop's input tensor, and hence its
    text, depends on that crop alone, whatever the batch size and whatever else is on the
    page. Batches are small, and on a CPU a larger one is no faster per crop. The resize,
    normalisation, session and CTC decoder are rapidocr's.
    """

    name = "rapidocr"

    def __init__(
        self, model_path: Path = REC_MODEL_INT8, batch_size: int = 16, threads: int | None = None
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        _quiet_rapidocr()
        # OpenVINO's request is one at a time (see `_read`): its threads go to that one.
        self._calls, per_call = (
            calls.plan(threads) if base.RUNTIME == "onnxruntime" else (1, threads)
        )
        root = _config("Rec", Path(model_path), per_call)
        if not _has_alphabet(root.Rec):
            raise ValueError(
                f"RapidOCR recognition model {model_path} has no embedded 'character' "
                "alphabet; use an ONNX export that carries it (the wheel's models do)."
            )
        self._rec = TextRecognizer(root.Rec)
        self._height = int(root.Rec.rec_img_shape[1])
        # The model's classes: rapidocr's decoder alphabet, blank first and space last.
        self.charset = (ctc.BLANK, *self._rec.postprocess_op.character[1:])
        self.batch_size = batch_size
        self.version = _version(Path(model_path), _rec_params(root))

    def release_memory(self) -> None:
        """Drop what the model keeps between pages (see `release_stage`)."""
        release_stage(self._rec)

    def recognise(self, crops: list[Image.Image]) -> list[tuple[str, float | None]]:
        return [(text, confidence) for text, confidence, _ in self.recognise_words(crops)]

    def recognise_words(
        self, crops: list[Image.Image]
    ) -> list[tuple[str, float | None, list[ir.Word] | None]]:
        """As `recognise`, plus each crop's words in crop pixels (None: no boxes for it)."""
        return [(text, confidence, words) for text, confidence, words, _ in self._read(crops)]

    def posteriors(self, crops: Sequence[Image.Image]) -> list[ctc.Posterior]:
        """Each crop's CTC posterior (pruned to the classes it gives weight, see
        `ctc.prune`), from the same forward pass `recognise` makes: crops this model read
        recently come from `ctc.RECENT`, the others are read now, batched."""
        return ctc.recall(
            self.version, crops, lambda todo, keys: [p for *_, p in self._read(todo, keys)]
        )

    def _read(
        self, crops: Sequence[Image.Image], keys: Sequence[str] | None = None
    ) -> list[tuple[str, float | None, list[ir.Word] | None, ctc.Posterior]]:
        """(text, confidence, words, posterior) per crop, batched by input width, the
        batches run side by side (`calls`); the posteriors are kept in `ctc.RECENT` under
        the crops' keys."""
        arrays = [_to_bgr(c) for c in crops]
        keys = [ctc.crop_key(c) for c in crops] if keys is None else keys
        widths = [self._padded_width(array) for array in arrays]
        chunks = calls.batches(widths, self.batch_size, WIDTH_BUDGET)
        batches = calls.run(
            [partial(self._read_batch, arrays, width, chunk) for width, chunk in chunks],
            [width * len(chunk) for width, chunk in chunks],
            self._calls,
        )
        results: list[Any] = [None] * len(arrays)
        for (_, chunk), batch in zip(chunks, batches, strict=True):
            for i, result in zip(chunk, batch, strict=True):
                ctc.RECENT.put(self.version, keys[i], result[3])
                results[i] = result
        return results

    def _read_batch(
        self, arrays: Sequence[np.ndarray], width: int, chunk: list[int]
    ) -> list[tuple[str, float, list[ir.Word] | None, ctc.Posterior]]:
        """One model call: the crops `chunk` (indices into `arrays`) at input `width`."""
        batch = np.stack([self._normalise(arrays[i], width) for i in chunk])
        # OpenVINO's output is a view of the request's buffer: used up before the next call.
        preds = self._rec.session(batch)
        # The share of each input's width that is crop, not padding: rapidocr's word boxes
        # measure CTC columns against it.
        shares = [self._resized_width(arrays[i], width) / width for i in chunk]
        lines, infos = self._rec.postprocess_op(preds, True, wh_ratio_list=shares, max_wh_ratio=1.0)
        out = []
        for n, (i, (text, score), info) in enumerate(zip(chunk, lines, infos, strict=True)):
            words = _word_boxes(str(text), info, arrays[i].shape[1], arrays[i].shape[0])
            out.append(
                (str(text), float(score), words, ctc.prune(self.name, preds[n], self.charset))
            )
        return out

    def _resized_width(self, array: np.ndarray, width: int) -> int:
        h, w = array.shape[:2]
        return min(width, math.ceil(self._height * w / h))

    def _padded_width(self, array: np.ndarray) -> int:
        h, w = array.shape[:2]
        return input_width(math.ceil(self._height * w / h))

    def _normalise(self, array: np.ndarray, width: int) -> np.ndarray:
        """rapidocr's resize_norm_img with an explicit target width."""
        resized_w = self._resized_width(array, width)
        resized = cv2.resize(array, (resized_w, self._height)).astype(np.float32)
        padded = np.zeros((3, self._height, width), dtype=np.float32)
        padded[:, :, :resized_w] = (resized.transpose(2, 0, 1) / 255 - 0.5) / 0.5
        return padded


def _word_boxes(text: str, info: Any, width: int, height: int) -> list[ir.Word] | None:
    """The words of `text` (split on whitespace) with boxes from rapidocr's character boxes
    (CTC column positions scaled to the crop), full crop height; each word's confidence is
    the mean of its characters'. None when the characters and boxes do not pair up."""
    words_text = text.split()
    if not words_text:
        return []
    if not info.words:
        return None
    quad = np.array([[0, 0], [width, 0], [width, height], [0, height]], dtype=np.float32)
    _, boxes, _ = CalRecBoxes().cal_ocr_word_box(text, quad, info, return_single_char_box=True)
    # rapidocr's confidences are per decoded character, spaces included; boxes skip spaces.
    confs = list(info.confs or [])
    chars = [(i, char) for i, char in enumerate(text) if not char.isspace()]
    if len(boxes) != len(chars):
        return None
    spans, scores, seen = [], [], 0
    for word in words_text:
        cells = boxes[seen : seen + len(word)]
        spans.append((min(c[0][0] for c in cells), max(c[1][0] for c in cells)))
        scores.append([confs[i] for i, _ in chars[seen : seen + len(word)] if i < len(confs)])
        seen += len(word)
    for i in range(len(spans) - 1):  # neighbours that overlap meet halfway, as rapidocr's
        (a0, a1), (b0, b1) = spans[i], spans[i + 1]
        if a1 > b0:
            middle = (a1 + b0) / 2
            spans[i], spans[i + 1] = (a0, middle), (middle, b1)
    words = []
    for word, (left, right), word_scores in zip(words_text, spans, scores, strict=True):
        x0 = int(min(max(left, 0), width))
        x1 = int(min(max(right, x0), width))
        words.append(
            ir.Word(
                text=word,
                bbox=ir.BBox(x0=x0, y0=0, x1=x1, y1=height),
                confidence=float(np.mean(word_scores)) if word_scores else None,
            )
        )
    return words
