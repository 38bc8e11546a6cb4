"""Build the int8 text detector that ships in `ocrfleet/engines/models` from the fp32 one in
the rapidocr wheel (issue 20: the detector was a third of a page's CPU time).

Static quantisation, QDQ, weights int8 per output channel, activations uint8 with ranges
from onnxruntime's MinMax calibration (moving average) over the detector's own inputs on
`--receipts` SROIE receipts of the training set beside realdocs (chosen with a fixed seed),
read through `RapidDetector` (its resizing and windows). Receipts only, so that every other
kind of page the benches check it on (books, UNLV scans, olmOCR PDFs, UW3) is out of the
calibration's domain. The model is not calibrated for an input of one colour (it drew boxes
on a plain 400 x 300 page); the detector never runs it on one (`rapidocr._one_colour`).
The model's opset is raised to 17 first (per-channel DequantizeLinear needs 13).
Calibration and quantisation are deterministic: the same inputs give the same file, and
this prints its sha256.

    python scripts/quantize_detector.py [--receipts 6] [--out PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import tempfile
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

from bench.corpus import SROIE  # noqa: E402
from ocrfleet.engines.rapidocr import DET_MODEL, DET_MODEL_INT8, RapidDetector  # noqa: E402

SEED = 7
CALIBRATION_INPUTS = 12


def detector_inputs(receipts: int) -> list[np.ndarray]:
    """The fp32 detector's model inputs on `receipts` receipts, every window of each."""
    images = sorted((SROIE / "images").glob("*.jpg"))
    if not images:
        raise SystemExit(f"no receipts under {SROIE / 'images'}: calibration needs real pages")
    detector = RapidDetector(DET_MODEL)
    seen: list[np.ndarray] = []
    run = detector._det.session

    def recorded(batch: np.ndarray) -> np.ndarray:
        seen.append(np.array(batch, copy=True))
        return run(batch)

    detector._det.session = detector._window_det.session = recorded
    for path in random.Random(SEED).sample(images, receipts):
        with Image.open(path) as image:
            detector.detect(image.convert("RGB"))
    step = max(1, len(seen) // CALIBRATION_INPUTS)
    return seen[::step][:CALIBRATION_INPUTS]


class Inputs(CalibrationDataReader):
    def __init__(self, name: str, batches: list[np.ndarray]) -> None:
        self._feeds = iter([{name: batch} for batch in batches])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def quantise(batches: list[np.ndarray], out: Path) -> None:
    model = onnx.load(str(DET_MODEL))
    with tempfile.TemporaryDirectory() as tmp:
        raised, prepared = Path(tmp) / "opset17.onnx", Path(tmp) / "prepared.onnx"
        onnx.save(version_converter.convert_version(model, 17), str(raised))
        quant_pre_process(str(raised), str(prepared), skip_symbolic_shape=True)
        name = onnx.load(str(prepared)).graph.input[0].name
        quantize_static(
            str(prepared),
            str(out),
            Inputs(name, batches),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"CalibMovingAverage": True},
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--receipts", type=int, default=6)
    parser.add_argument("--out", type=Path, default=DET_MODEL_INT8)
    args = parser.parse_args()
    batches = detector_inputs(args.receipts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    quantise(batches, args.out)
    digest = hashlib.sha256(args.out.read_bytes()).hexdigest()
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes) from {len(batches)} inputs")
    print(f"sha256 {digest}")


if __name__ == "__main__":
    main()
