"""rapidocr's model catalogue, parsed once a process.

At import rapidocr parses its catalogue of downloadable models (`default_models.yaml`,
1,600 lines) with OmegaConf twice: `utils.model_resolver` and `inference_engine.base` each
keep a parse, 0.15 s and 0.22 s of a one-page `ocrfleet run` (3.4 s) on this machine, paid
again by every `--jobs` worker. ocrfleet names its models by path, so the catalogue is never
used to download, and both modules only read it. Importing this module before rapidocr makes
`OmegaConf.load` hand both the same parse of that one file; any other file loads as before.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

CATALOGUE = ("rapidocr", "default_models.yaml")  # (package folder, file name)
_load = OmegaConf.load
_parsed: dict[str, DictConfig | ListConfig] = {}


def _load_once(file_: Any, *args: Any, **kwargs: Any) -> DictConfig | ListConfig:
    if isinstance(file_, str | os.PathLike):
        path = Path(file_)
        if (path.parent.name, path.name) == CATALOGUE:
            key = str(path.resolve())
            if key not in _parsed:
                _parsed[key] = _load(file_, *args, **kwargs)
            return _parsed[key]
    return _load(file_, *args, **kwargs)


if OmegaConf.load is _load:  # once, however often this module is reloaded
    OmegaConf.load = staticmethod(_load_once)  # type: ignore[method-assign]
