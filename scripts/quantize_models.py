"""Build the int8 models that ship in `ocrfleet/engines/models` from the fp32 ones in the
rapidocr wheel (issue 20: detection and recognition were most of a page's CPU time).

Static quantisation, QDQ, weights int8 per output channel, activations uint8 with ranges
from onnxruntime's MinMax calibration (moving average) over the model's own inputs on
`--receipts` SROIE receipts of the training set beside realdocs (chosen with a fixed seed),
read through ocrfleet's own engine (its resizing, windows and widths). Receipts only, so
that every other kind of page the benches check the models on (books, UNLV scans, olmOCR
PDFs, UW3) is out of the calibration's domain. The models' opset is raised to 17 first
(per-channel DequantizeLinear needs 13).

- `det`, the text detector: every operator. It is not calibrated for an input of one colour
  (it drew boxes on a plain 400 x 300 page); the detector never runs it on one
  (`rapidocr._one_colour`).
- `rec`, the recogniser: the convolutions of its backbone only, read from the truth-box line
  crops of receipts outside the benches' spread (`bench.corpus.receipt_images`). The SVTR
  neck after the backbone's pooling, where int8 lost most (3.5-6 dB of activation SQNR in
  its last blocks), and the 18,710-class output layer stay float: quantising every
  convolution, or those of the neck too, cost 8-20% more character errors.

Calibration and quantisation are deterministic: the same inputs give the same file, and
this prints its sha256.

    python scripts/quantize_models.py det|rec [--receipts N] [--out PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import version_converter
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.corpus import SROIE, receipt_crops, receipt_images  # noqa: E402
from ocrfleet.engines.rapidocr import (  # noqa: E402
    DET_MODEL,
    DET_MODEL_INT8,
    REC_MODEL,
    REC_MODEL_INT8,
    RapidDetector,
    RapidRecogniser,
)

SEED = 7
# Receipts read for calibration, and the model inputs kept, evenly spaced over those recorded.
RECEIPTS = {"det": 6, "rec": 12}
CALIBRATION_INPUTS = {"det": 12, "rec": 64}
# Receipts the benches read (rec_width, vs_ocrmypdf, det_side take this spread or less):
# never calibrated on.
BENCH_RECEIPTS = 40


def _receipts(count: int, exclude: set[Path]) -> list[Path]:
    images = sorted((SROIE / "images").glob("*.jpg"))
    if not images:
        raise SystemExit(f"no receipts under {SROIE / 'images'}: calibration needs real pages")
    return random.Random(SEED).sample([p for p in images if p not in exclude], count)


def _recording(owner: object, sessions: list[str], seen: list[np.ndarray]) -> None:
    """Record every batch the sessions named on `owner` run."""
    run = getattr(owner, sessions[0]).session

    def recorded(batch: np.ndarray) -> np.ndarray:
        seen.append(np.array(batch, copy=True))
        return run(batch)

    for name in sessions:
        getattr(owner, name).session = recorded


def detector_inputs(receipts: int) -> list[np.ndarray]:
    """The fp32 detector's model inputs on `receipts` receipts, every window of each."""
    detector, seen = RapidDetector(DET_MODEL), []
    _recording(detector, ["_det", "_window_det"], seen)
    for path in _receipts(receipts, set()):
        with Image.open(path) as image:
            detector.detect(image.convert("RGB"))
    return seen


def recogniser_inputs(receipts: int) -> list[np.ndarray]:
    """The fp32 recogniser's model inputs, one crop each, on the truth-box line crops of
    `receipts` receipts."""
    recogniser, seen = RapidRecogniser(REC_MODEL, batch_size=1), []
    _recording(recogniser, ["_rec"], seen)
    crops, _ = receipt_crops(_receipts(receipts, set(receipt_images(BENCH_RECEIPTS))))
    recogniser.recognise(crops)
    return seen


def backbone_convolutions(graph: onnx.GraphProto) -> list[str]:
    """The recogniser's convolutions before its pooling into the neck."""
    nodes = list(graph.node)
    pool = next(i for i, node in enumerate(nodes) if node.op_type == "AveragePool")
    return [node.name for node in nodes[:pool] if node.op_type == "Conv"]


class Inputs(CalibrationDataReader):
    def __init__(self, name: str, batches: list[np.ndarray]) -> None:
        self._feeds = iter([{name: batch} for batch in batches])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def quantise(
    source: Path,
    batches: list[np.ndarray],
    out: Path,
    only: Callable[[onnx.GraphProto], list[str]] | None = None,
) -> None:
    """Quantise `source` into `out`; `only`: the nodes to quantise (default: every one)."""
    model = onnx.load(str(source))
    with tempfile.TemporaryDirectory() as tmp:
        raised, prepared = Path(tmp) / "opset17.onnx", Path(tmp) / "prepared.onnx"
        onnx.save(version_converter.convert_version(model, 17), str(raised))
        quant_pre_process(str(raised), str(prepared), skip_symbolic_shape=True)
        graph = onnx.load(str(prepared)).graph
        selection = {}
        if only is not None:
            chosen = set(only(graph))
            selection = {
                "op_types_to_quantize": sorted({n.op_type for n in graph.node if n.name in chosen}),
                "nodes_to_exclude": [n.name for n in graph.node if n.name not in chosen],
            }
        quantize_static(
            str(prepared),
            str(out),
            Inputs(graph.input[0].name, batches),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"CalibMovingAverage": True},
            **selection,
        )


MODELS = {
    "det": (DET_MODEL, DET_MODEL_INT8, detector_inputs, None),
    "rec": (REC_MODEL, REC_MODEL_INT8, recogniser_inputs, backbone_convolutions),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--receipts", type=int, help=f"default: {RECEIPTS}")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    source, shipped, inputs, only = MODELS[args.model]
    out = args.out or shipped
    seen = inputs(args.receipts or RECEIPTS[args.model])
    step = max(1, len(seen) // CALIBRATION_INPUTS[args.model])
    batches = seen[::step][: CALIBRATION_INPUTS[args.model]]
    out.parent.mkdir(parents=True, exist_ok=True)
    quantise(source, batches, out, only)
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    print(f"wrote {out} ({out.stat().st_size} bytes) from {len(batches)} inputs")
    print(f"sha256 {digest}")


if __name__ == "__main__":
    main()
