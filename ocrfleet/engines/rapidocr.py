"""RapidOCR (PP-OCR ONNX models, CPU) split into its two stages: the text-line detector and
the line recogniser, so detection runs once per page and recognition runs batched over the
crops that every other engine and scorer also sees.

We build the onnxruntime sessions ourselves from the model files inside the rapidocr wheel
and hand them to rapidocr's TextDetector / TextRecognizer. That keeps rapidocr's pre- and
post-processing (and its upstream defaults) while making its model download path
unreachable: a missing model is a FileNotFoundError at construction, never a download.

Not used: rapidocr's text-line orientation classifier (on by default in its full
pipeline; it turns lines it reads as upside down). Our regions are axis-aligned crops of
upright pages; on the 264 detected lines of the realdocs tesseract_test pages it would have
turned one crop, an 18x18 px speck, and it costs a model call per line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from functools import lru_cache
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any, NoReturn

import cv2
import numpy as np
import onnxruntime as ort
from omegaconf import DictConfig, flag_override
from PIL import Image
from rapidocr.ch_ppocr_det import TextDetector
from rapidocr.ch_ppocr_rec import TextRecognizer
from rapidocr.main import DEFAULT_CFG_PATH
from rapidocr.utils.parse_parameters import ParseParams
from rapidocr.utils.process_img import (
    apply_vertical_padding,
    map_boxes_to_original,
    resize_image_within_bounds,
)

from ocrfleet import ir
from ocrfleet.pipeline.regions import order_regions, polygon_bbox

MODEL_DIR = Path(DEFAULT_CFG_PATH).parent / "models"
DET_MODEL = MODEL_DIR / "PP-OCRv6_det_small.onnx"
REC_MODEL = MODEL_DIR / "PP-OCRv6_rec_small.onnx"
WIDTH_STEP = 32  # recogniser inputs are padded to a multiple of this many pixels
# Width buckets grow geometrically above the model's base width, so the crops of a page fall
# into a few buckets and model calls fill up; a crop pads at most this share of its width.
WIDTH_GROWTH = 1.25
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


def _config(section: str, session: ort.InferenceSession) -> DictConfig:
    """rapidocr's own defaults, with our session in `section` instead of a model lookup."""
    cfg = ParseParams.load(DEFAULT_CFG_PATH)
    stage = cfg[section]
    with flag_override(stage, "allow_objects", True):
        stage.session = session
    stage.font_path = None
    return cfg


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


def _det_params(root: DictConfig) -> dict[str, Any]:
    g, det = root.Global, root.Det
    params = {k: g[k] for k in ("min_side_len", "max_side_len", "width_height_ratio", "min_height")}
    for key in _DET_KEYS:
        params[key] = det[key]
    return json.loads(json.dumps(params, default=list))


def _rec_params(root: DictConfig) -> dict[str, Any]:
    return {
        "rec_img_shape": list(root.Rec.rec_img_shape),
        "width_step": WIDTH_STEP,
        "width_growth": WIDTH_GROWTH,
        "use_cls": False,
    }


def detector_version(model_path: Path = DET_MODEL) -> str:
    """The detector's version without loading the model (for run_id)."""
    return _version(Path(model_path), _det_params(ParseParams.load(DEFAULT_CFG_PATH)))


def recogniser_version(model_path: Path = REC_MODEL) -> str:
    """The recogniser's version without loading the model (for run_id)."""
    return _version(Path(model_path), _rec_params(ParseParams.load(DEFAULT_CFG_PATH)))


def _to_bgr(image: Image.Image) -> np.ndarray:
    if image.width == 0 or image.height == 0:
        raise ValueError(f"empty image {image.width}x{image.height}: nothing to read")
    rgb = np.asarray(image.convert("RGB"))
    return np.ascontiguousarray(rgb[:, :, ::-1])


class RapidDetector:
    """Text-line detector (PP-OCR DB). Regions come back as clipped axis-aligned boxes in
    reading order; rapidocr's page preprocessing (long side capped at 2000 px, vertical
    padding of very wide images) is applied as in its full pipeline."""

    name = "rapidocr"

    def __init__(self, model_path: Path = DET_MODEL, threads: int | None = None) -> None:
        _quiet_rapidocr()
        root = _config("Det", _session(Path(model_path), threads))
        g = root.Global
        self._det = TextDetector(root.Det)
        self._min_side, self._max_side = int(g.min_side_len), int(g.max_side_len)
        self._pad_ratio, self._pad_min_h = float(g.width_height_ratio), float(g.min_height)
        self.version = _version(Path(model_path), _det_params(root))

    def detect(self, page: Image.Image) -> list[ir.Region]:
        original = _to_bgr(page)
        img, ratio_h, ratio_w = resize_image_within_bounds(original, self._min_side, self._max_side)
        record: dict[str, Any] = {"preprocess": {"ratio_h": ratio_h, "ratio_w": ratio_w}}
        img, record = apply_vertical_padding(img, record, self._pad_ratio, self._pad_min_h)
        result = self._det(img)
        if result.boxes is None or len(result.boxes) == 0:
            return []
        polygons = map_boxes_to_original(
            np.asarray(result.boxes, dtype=np.float32), record, page.height, page.width
        )
        regions = []
        for polygon, score in zip(polygons, result.scores, strict=True):
            bbox = polygon_bbox(polygon.tolist(), page.width, page.height)
            if bbox is not None:
                regions.append(ir.Region(number=1, bbox=bbox, det_score=float(score)))
        return order_regions(regions)


def bucket_width(natural: int, base: int) -> int:
    """The padded input width of a crop whose height-normalised width is `natural`: `base`
    (the model's own minimum), else the first of base * WIDTH_GROWTH**k, rounded up to
    WIDTH_STEP, that holds it."""
    width = base
    while width < natural:
        width = -(-math.ceil(width * WIDTH_GROWTH) // WIDTH_STEP) * WIDTH_STEP
    return width


class RapidRecogniser:
    """Text-line recogniser (PP-OCR CTC), batched so that batching cannot change the text.

    rapidocr's own batching pads every crop of a batch to the widest one, and padding
    changes what this model reads (7 of 264 realdocs lines read differently at batch size 1
    and 16). Here each crop is resized to the model height and padded to a width bucket
    chosen from its own width alone (`bucket_width`); only crops of the same bucket share a
    model call, so a crop's input tensor, and hence its text, depends on that crop alone,
    whatever the batch size and whatever else is on the page. Buckets grow geometrically
    (`WIDTH_GROWTH`), so a page's crops fall into a few of them and batches fill: one model
    call per bucket and `batch_size` crops. The resize, normalisation, session and CTC
    decoder are rapidocr's.
    """

    name = "rapidocr"

    def __init__(
        self, model_path: Path = REC_MODEL, batch_size: int = 16, threads: int | None = None
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        _quiet_rapidocr()
        session = _session(Path(model_path), threads)
        if "character" not in session.get_modelmeta().custom_metadata_map:
            # Without an embedded alphabet rapidocr would fetch a dictionary file.
            raise ValueError(
                f"RapidOCR recognition model {model_path} has no embedded 'character' "
                "alphabet; use an ONNX export that carries it (the wheel's models do)."
            )
        root = _config("Rec", session)
        self._rec = TextRecognizer(root.Rec)
        _, self._height, self._min_width = (int(v) for v in root.Rec.rec_img_shape)
        self.batch_size = batch_size
        self.version = _version(Path(model_path), _rec_params(root))

    def recognise(self, crops: list[Image.Image]) -> list[tuple[str, float | None]]:
        arrays = [_to_bgr(c) for c in crops]
        by_width: dict[int, list[int]] = {}
        for i, array in enumerate(arrays):
            by_width.setdefault(self._padded_width(array), []).append(i)
        results: list[tuple[str, float | None]] = [("", None)] * len(arrays)
        for width, ids in sorted(by_width.items()):
            for start in range(0, len(ids), self.batch_size):
                chunk = ids[start : start + self.batch_size]
                batch = np.stack([self._normalise(arrays[i], width) for i in chunk])
                preds = self._rec.session(batch)
                lines, _ = self._rec.postprocess_op(
                    preds, False, wh_ratio_list=[1.0] * len(chunk), max_wh_ratio=1.0
                )
                for i, (text, score) in zip(chunk, lines, strict=True):
                    results[i] = (str(text), float(score))
        return results

    def _padded_width(self, array: np.ndarray) -> int:
        h, w = array.shape[:2]
        return bucket_width(math.ceil(self._height * w / h), self._min_width)

    def _normalise(self, array: np.ndarray, width: int) -> np.ndarray:
        """rapidocr's resize_norm_img with an explicit target width."""
        h, w = array.shape[:2]
        resized_w = min(width, math.ceil(self._height * w / h))
        resized = cv2.resize(array, (resized_w, self._height)).astype(np.float32)
        padded = np.zeros((3, self._height, width), dtype=np.float32)
        padded[:, :, :resized_w] = (resized.transpose(2, 0, 1) / 255 - 0.5) / 0.5
        return padded
