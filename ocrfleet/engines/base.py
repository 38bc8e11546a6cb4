"""The engine interfaces: a detector finds regions on a page, a recogniser reads crops."""

from __future__ import annotations

import importlib.util
from typing import NamedTuple, Protocol

from PIL import Image

from ocrfleet import ir

# The runtime RapidOCR's and the layout model's ONNX files run on: OpenVINO's CPU plugin
# where it is installed (the `openvino` extra), else onnxruntime. On this project's 2-core
# machine OpenVINO ran these models' calls 1.3-1.6x faster with the same boxes and texts, but
# loaded them 5 s slower and peaked 300 MB higher per process, so it is not the default.
# It enters the models' versions, hence run_id.
RUNTIME = "openvino" if importlib.util.find_spec("openvino") is not None else "onnxruntime"


class Detector(Protocol):
    name: str
    version: str  # enters run_id (model file hashes)

    def detect(self, page: Image.Image) -> list[ir.Region]:
        """Regions in reading order, numbered from 1."""
        ...

    @property
    def last_plan(self) -> ir.DetectionPlan | None:
        """How the last `detect` call covered its page (whole or on tiles, at what scale),
        for the page's params; None before the first."""
        ...


class Reading(NamedTuple):
    """What a generative engine returns per crop; a plain (text, confidence) pair is too."""

    text: str
    confidence: float | None
    truncated: bool = False  # generation stopped at the token limit, not at its end


class Recogniser(Protocol):
    name: str
    version: str  # enters run_id (model file hashes)

    def recognise(self, crops: list[Image.Image]) -> list[tuple[str, float | None]]:
        """(text, confidence in [0, 1] or None) per crop, in order, batched internally.

        An engine may also declare `categories`, the region categories it has its own mode
        for (default: text only); other tables and formulas reach it line by line."""
        ...


class WordRecogniser(Recogniser, Protocol):
    """A recogniser that also locates words; the recognise stage prefers this method."""

    def recognise_words(
        self, crops: list[Image.Image]
    ) -> list[tuple[str, float | None, list[ir.Word] | None]]:
        """As `recognise`, plus each crop's words in crop pixels (None where the engine
        could not place them: the recognise stage places them proportionally)."""
        ...
