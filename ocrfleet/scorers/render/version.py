"""The renderer's version: enters run_id, because the renderer shapes the model's input."""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import version
from pathlib import Path

import PIL
from PIL import features

from ocrfleet.scorers.render.fonts import font_sha256, resolve_font_path

# Bump on any change to layout, fitting, colours or the table/formula rules.
RENDERER_MANUAL_VERSION = "1"


@lru_cache(maxsize=8)
def _version(path: Path) -> str:
    return (
        f"render{RENDERER_MANUAL_VERSION}"
        f"+font-{font_sha256(path)[:16]}"
        f"+mpl-{version('matplotlib')}"
        f"+pil-{PIL.__version__}"
        f"+ft-{features.version('freetype2')}"
    )


def renderer_version(font_path: Path | str | None = None) -> str:
    """Manual version, font sha256 (16 hex), matplotlib, Pillow and FreeType versions.

    Pillow and FreeType are in it too: they rasterise the glyphs."""
    return _version(resolve_font_path(font_path))
