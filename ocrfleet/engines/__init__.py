"""Engines by name: the detector and the recognisers named in `settings.engines`.

Engine modules are imported inside the functions, so importing `ocrfleet.engines` loads no
model runtime and a tesseract-only process never imports onnxruntime.
"""

from __future__ import annotations

from typing import Any

from ocrfleet.config import Settings
from ocrfleet.engines.base import Detector, Recogniser

__all__ = ["describe_engines", "engine_libraries", "load_detector", "load_recognisers"]

KNOWN = "rapidocr, tesseract, easyocr, minicpm"
# The Python libraries whose version can change each recogniser's output (for run_id):
# tesseract is a binary (its version is the engine's), EasyOCR runs on onnxruntime.
LIBRARIES: dict[str, tuple[str, ...]] = {
    "rapidocr": ("onnxruntime", "rapidocr"),
    "tesseract": (),
    "easyocr": ("onnxruntime",),
    "minicpm": ("torch", "transformers"),
}


def load_detector(settings: Settings) -> Detector:
    """The region detector: layout blocks over RapidOCR's text lines (`OCRFLEET_LAYOUT=rapid`)
    or the text lines alone (`lines`)."""
    from ocrfleet.engines.rapidocr import DET_MODELS, RapidDetector

    lines = RapidDetector(
        DET_MODELS[settings.det_precision],
        threads=settings.onnx_threads,
        text_height=settings.det_text_height,
    )
    if settings.layout == "lines":
        return lines
    from ocrfleet.engines.layout import LayoutDetector

    return LayoutDetector(lines, threads=settings.onnx_threads)


def load_recognisers(settings: Settings) -> list[Recogniser]:
    """One recogniser per name in `settings.engines`, in that order. Fails at load time, not
    at the first page, when a model, binary or language is missing."""
    return [_load_recogniser(name, settings) for name in settings.engines]


def engine_libraries(settings: Settings) -> set[str]:
    """The libraries the detector and the recognisers named in `settings.engines` use."""
    names = {"onnxruntime", "rapidocr", *(["rapid-layout"] if settings.layout == "rapid" else [])}
    for name in settings.engines:
        if name not in LIBRARIES:
            raise ValueError(f"unknown engine {name!r}; known: {KNOWN}")
        names.update(LIBRARIES[name])
    return names


def describe_engines(settings: Settings) -> dict[str, Any]:
    """Names and versions of the detector and recognisers, without loading any model (for
    run_id: a version changes when a model file, engine version or output parameter does),
    and the per-call timeout, after which a reading is an error."""
    from ocrfleet.engines.rapidocr import DET_MODELS, detector_version

    version = detector_version(DET_MODELS[settings.det_precision], settings.det_text_height)
    detector = {"name": "rapidocr", "version": version}
    if settings.layout == "rapid":
        from ocrfleet.engines.layout import layout_version

        detector = {"name": "rapid-layout", "version": f"{layout_version()}/{detector['version']}"}
    return {
        "detector": detector,
        "mode": settings.engine_mode,
        "timeout_s": settings.engine_timeout_s,
        "recognisers": [
            {"name": name, "version": _recogniser_version(name, settings)}
            for name in settings.engines
        ],
    }


def _load_recogniser(name: str, settings: Settings) -> Recogniser:
    if name == "rapidocr":
        from ocrfleet.engines.rapidocr import REC_MODELS, RapidRecogniser

        return RapidRecogniser(
            REC_MODELS[settings.rec_precision],
            batch_size=settings.rec_batch_size,
            threads=settings.onnx_threads,
        )
    if name == "tesseract":
        from ocrfleet.engines.tesseract import TesseractRecogniser

        return TesseractRecogniser(lang=settings.tesseract_lang, processes=settings.onnx_threads)
    if name == "easyocr":
        from ocrfleet.engines.easyocr import EasyOCRRecogniser

        return EasyOCRRecogniser(
            model_path=settings.easyocr_model_path,
            batch_size=settings.rec_batch_size,
            threads=settings.onnx_threads,
            cache_dir=settings.cache_dir,
        )
    if name == "minicpm":
        from ocrfleet.engines.minicpm import MiniCPMRecogniser

        return MiniCPMRecogniser(settings)
    raise ValueError(f"unknown engine {name!r}; known: {KNOWN}")


def _recogniser_version(name: str, settings: Settings) -> str:
    if name == "rapidocr":
        from ocrfleet.engines.rapidocr import REC_MODELS, recogniser_version

        return recogniser_version(REC_MODELS[settings.rec_precision])
    if name == "tesseract":
        from ocrfleet.engines.tesseract import tesseract_version

        return tesseract_version(settings.tesseract_lang)
    if name == "easyocr":
        from ocrfleet.engines.easyocr import version as easyocr_version

        return easyocr_version(settings.easyocr_model_path)
    if name == "minicpm":
        from ocrfleet.engines.minicpm import version

        return version(settings)
    raise ValueError(f"unknown engine {name!r}; known: {KNOWN}")
