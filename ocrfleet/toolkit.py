"""The models a process needs to OCR a page, loaded once per process.

Workers load it after start and before the first task (never before a fork: CUDA does not
survive one); `ocrfleet run` loads it once for the whole run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ocrfleet.config import Settings
from ocrfleet.engines.base import Detector, Recogniser
from ocrfleet.scorers.base import Scorer

if TYPE_CHECKING:
    from ocrfleet.pipeline.orient import OrientationClassifier


@dataclass(frozen=True)
class Toolkit:
    settings: Settings
    detector: Detector
    recognisers: list[Recogniser]
    scorer: Scorer
    orienter: OrientationClassifier

    @property
    def line_detector(self) -> Detector:
        """The text-line detector: the layout detector's own, or the detector itself."""
        return getattr(self.detector, "lines", self.detector)

    def release_memory(self) -> None:
        """After a page is persisted: each model drops the buffers it keeps between calls
        (an engine's `release_memory`, where it has one), then the heap goes back to the
        system (`ocrfleet.memory.release_memory`)."""
        from ocrfleet.memory import release_memory

        models = {id(m): m for m in (self.detector, self.line_detector, *self.recognisers)}
        for model in models.values():
            release = getattr(model, "release_memory", None)
            if callable(release):
                release()
        release_memory()


def load_toolkit(settings: Settings) -> Toolkit:
    from ocrfleet.engines import load_detector, load_recognisers
    from ocrfleet.memory import bound_heap
    from ocrfleet.pipeline.orient import OrientationClassifier
    from ocrfleet.scorers import load_scorer

    bound_heap()
    recognisers = load_recognisers(settings)
    return Toolkit(
        settings=settings,
        detector=load_detector(settings),
        recognisers=recognisers,
        scorer=load_scorer(settings, recognisers),  # each model once: readers are shared
        orienter=OrientationClassifier(threads=settings.onnx_threads),
    )


_toolkits: dict[str, Toolkit] = {}


def drop_toolkits() -> None:
    """Let this process's models go (a process that has read its pages and goes on with
    other work: `ocrfleet run` writing its outputs), and give their memory back."""
    from ocrfleet.memory import release_memory

    _toolkits.clear()
    release_memory()


def get_toolkit(settings: Settings) -> Toolkit:
    """The process-wide toolkit for these settings. Keyed on the settings' JSON: Settings
    holds a list (`engines`), so it is frozen but not hashable and cannot key an lru_cache."""
    key = settings.model_dump_json()
    toolkit = _toolkits.get(key)
    if toolkit is None:
        toolkit = _toolkits[key] = load_toolkit(settings)
    return toolkit
