"""One page through every stage: regions → candidates → scores → decisions.

The same function runs in `ocrfleet run` and in the fleet's `process_page` task."""

from __future__ import annotations

from PIL import Image

from ocrfleet import ir
from ocrfleet.pipeline.recognise import recognise
from ocrfleet.pipeline.regions import detect_regions
from ocrfleet.pipeline.review import decide, score_units
from ocrfleet.scorers import load_policy
from ocrfleet.toolkit import Toolkit


def process_image(page_number: int, image: Image.Image, toolkit: Toolkit) -> ir.PageResult:
    settings = toolkit.settings
    regions = detect_regions(image, toolkit.detector)
    candidates = recognise(
        image,
        regions,
        toolkit.recognisers,
        mode=settings.engine_mode,
        timeout_s=settings.engine_timeout_s,
    )
    policy = load_policy(settings)
    scores = score_units(image, regions, candidates, toolkit.scorer, policy)
    decisions = decide(regions, candidates, scores, settings, policy)
    return ir.PageResult(
        page_number=page_number,
        regions=regions,
        candidates=candidates,
        scores=scores,
        decisions=decisions,
    )
