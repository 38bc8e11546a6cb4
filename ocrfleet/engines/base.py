"""The engine interfaces: a detector finds regions on a page, a recogniser reads crops."""

from __future__ import annotations

from typing import Protocol

from PIL import Image

from ocrfleet import ir


class Detector(Protocol):
    name: str
    version: str  # enters run_id (model file hashes)

    def detect(self, page: Image.Image) -> list[ir.Region]:
        """Regions in reading order, numbered from 1."""
        ...

    def plan(self, width: int, height: int) -> ir.DetectionPlan:
        """How a page of this size is detected (whole or on tiles), for the page's params."""
        ...


class Recogniser(Protocol):
    name: str
    version: str  # enters run_id (model file hashes)

    def recognise(self, crops: list[Image.Image]) -> list[tuple[str, float | None]]:
        """(text, confidence in [0, 1] or None) per crop, in order, batched internally."""
        ...
