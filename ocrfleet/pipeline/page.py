"""One page through every stage: orientation → regions → candidates → scores → decisions.

The one page path: the fleet's `process_page` task, `ocrfleet run`, `ocrfleet repro` and
the benches all call `process_image`, so a page is read the same way wherever it runs."""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

from ocrfleet import ir
from ocrfleet.memory import release_memory
from ocrfleet.pipeline import textlayer
from ocrfleet.pipeline.images import load_image
from ocrfleet.pipeline.orient import turn_upright, upright
from ocrfleet.pipeline.recognise import recognise
from ocrfleet.pipeline.regions import detect_regions
from ocrfleet.pipeline.review import decide, score_units
from ocrfleet.scorers import load_policy
from ocrfleet.toolkit import Toolkit


@dataclass(frozen=True)
class ProcessedPage:
    """A page's result, and the upright image it was read on (the result's regions are in
    its pixels) with the turn that made it upright."""

    result: ir.PageResult
    image: Image.Image
    orientation: ir.Orientation
    text_layer: textlayer.Judgement | None = None  # a PDF page's own text, judged
    detection: ir.DetectionPlan | None = None  # how its lines were found (None: not detected)


def process_png(page_number: int, data: bytes, toolkit: Toolkit) -> ProcessedPage:
    """A stored page, its PNG as the split wrote it (text layer included), through
    `process_image`: how the worker, `ocrfleet run` and `ocrfleet repro` read a page."""
    return process_image(page_number, load_image(data), toolkit, textlayer.read_png(data))


def process_image(
    page_number: int,
    image: Image.Image,
    toolkit: Toolkit,
    text_layer: ir.TextLayer | None = None,
) -> ProcessedPage:
    """`text_layer`: the PDF page's own text (`textlayer.read_png`); when it is good and
    the settings use text layers, its lines are the regions and its text their candidates,
    scored and decided as any engine's, and the page is not OCRed (but turned upright with
    its layer when its lines run sideways or upside down)."""
    settings = toolkit.settings
    judged = detection = None
    if settings.text_layer == "use" and text_layer is not None:
        judged = textlayer.judge(text_layer, image)
    if judged is not None and judged.good:
        assert text_layer is not None
        angle = textlayer.direction(text_layer)
        size = image.size
        if angle is None:  # no line of two words says which way it runs: as any page
            image, orientation = _upright(image, toolkit)
            angle = orientation.angle if orientation.applied else 0
        else:
            orientation = ir.Orientation(angle=angle, confidence=1.0, applied=angle != 0)
            image = turn_upright(image, angle)
        text_layer = textlayer.turned(text_layer, angle, size)
        regions, candidates = textlayer.reading(text_layer)
    else:
        image, orientation = _upright(image, toolkit)
        release_memory()  # each stage's peak on its own, not on what the last one freed
        regions = detect_regions(image, toolkit.detector)
        detection = toolkit.detector.last_plan
        release_memory()
        candidates = recognise(
            image,
            regions,
            toolkit.recognisers,
            mode=settings.engine_mode,
            timeout_s=settings.engine_timeout_s,
        )
    policy = load_policy(settings)
    release_memory()
    scores = score_units(image, regions, candidates, toolkit.scorer, policy)
    decisions = decide(regions, candidates, scores, settings, policy)
    result = ir.PageResult(
        page_number=page_number,
        regions=regions,
        candidates=candidates,
        scores=scores,
        decisions=decisions,
    )
    return ProcessedPage(result, image, orientation, judged, detection)


def _upright(image: Image.Image, toolkit: Toolkit) -> tuple[Image.Image, ir.Orientation]:
    return upright(
        image,
        toolkit.orienter,
        toolkit.settings.orientation_min_confidence,
        toolkit.line_detector,
        toolkit.recognisers[0],
    )
