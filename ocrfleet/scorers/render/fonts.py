"""The one font of the frozen renderer, loaded once per (path, size)."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from PIL import ImageFont

from ocrfleet.scorers.render.errors import FontNotFoundError

# Face 2 of NotoSansCJK-Regular.ttc is "Noto Sans CJK SC": Latin plus simplified-Chinese
# glyph forms. Changing it changes the pixels, so bump RENDERER_MANUAL_VERSION with it.
FONT_INDEX = 2


def default_font_path() -> Path:
    from ocrfleet.config import get_settings

    return get_settings().render_font_path


def resolve_font_path(font_path: Path | str | None) -> Path:
    """The font file to use; a missing file is a clear deployment error."""
    path = Path(font_path) if font_path is not None else default_font_path()
    if not path.is_file():
        raise FontNotFoundError(
            f"render font not found: {path} (set OCRFLEET_RENDER_FONT_PATH, or install Debian's "
            "fonts-noto-cjk, which provides /usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc)"
        )
    return path


@lru_cache(maxsize=512)
def load_font(path: Path, size: int) -> ImageFont.FreeTypeFont:
    # BASIC layout: no dependence on whether libraqm happens to be installed.
    return ImageFont.truetype(
        str(path), size=size, index=FONT_INDEX, layout_engine=ImageFont.Layout.BASIC
    )


@lru_cache(maxsize=8)
def font_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
