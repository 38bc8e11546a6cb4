"""The one image loader of the project: input images, and page images read back from the store.

Every image goes through the same steps (Pillow open, `ImageOps.exif_transpose`, then RGB by
`to_rgb`), so a page looks the same to every stage and every run. Pixel limits are applied
from the caller's value, never by changing Pillow's global limit for the whole process.
"""

from __future__ import annotations

import io
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from PIL import Image, ImageOps

WHITE = (255, 255, 255)

#: Pillow format name for each image media type we accept; nothing else is ever parsed.
PIL_FORMATS: dict[str, str] = {
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/tiff": "TIFF",
    "image/gif": "GIF",
    "image/webp": "WEBP",
    "image/bmp": "BMP",
}
#: Formats whose frames are pages. Other formats (APNG, animated WebP, MPO) give frame one.
MULTI_PAGE = frozenset({"image/tiff", "image/gif"})

_BMP_INFO_HEADER_SIZES = frozenset({12, 16, 40, 52, 56, 64, 108, 124})
_LIMIT_LOCK = threading.Lock()


class InputRejected(Exception):
    """An input the pipeline refuses, with a stable `reason` code and a human `detail`.

    Both go in `args`, so the exception survives pickling between Celery processes.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


def image_media_type(data: bytes) -> str | None:
    """The media type of an accepted image format from its magic bytes, else None."""
    head = data[:32]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "image/tiff"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    # "BM" alone is too weak (any text starting with "BM"); the info header size must fit too.
    if head[:2] == b"BM" and int.from_bytes(head[14:18], "little") in _BMP_INFO_HEADER_SIZES:
        return "image/bmp"
    return None


@contextmanager
def _reading(what: str, max_pixels: int | None) -> Iterator[None]:
    """A block of Pillow calls on untrusted bytes; every failure becomes `InputRejected`.

    Pillow's decompression-bomb limit is a module global, so it is set to `max_pixels` for
    this block only, under a lock, and restored; its warning is raised as an error here, and
    both it and the error mean `too_many_pixels`. The lock serialises image decoding between
    threads of one process (workers are processes, so this costs nothing there).
    """
    with _LIMIT_LOCK, warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        saved = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = max_pixels
        try:
            yield
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise InputRejected("too_many_pixels", f"{what}: {exc}") from None
        except (InputRejected, MemoryError):
            raise
        except Exception as exc:  # Pillow raises many types on bad bytes; all mean the same.
            raise InputRejected("corrupt_image", f"{what}: {type(exc).__name__}: {exc}") from None
        finally:
            Image.MAX_IMAGE_PIXELS = saved


def check_pixels(width: int, height: int, max_pixels: int | None, where: str) -> None:
    """Reject a page whose pixel count is over `max_pixels` (None: no limit)."""
    if max_pixels is not None and width * height > max_pixels:
        raise InputRejected(
            "too_many_pixels",
            f"{where} is {width}x{height} = {width * height} pixels, over the limit of "
            f"{max_pixels} (max_pixels)",
        )


def _open(data: bytes, max_pixels: int | None) -> tuple[Image.Image, str]:
    media_type = image_media_type(data)
    if media_type is None:
        raise InputRejected(
            "unsupported_type", "the bytes are not PNG, JPEG, TIFF, GIF, WebP or BMP"
        )
    # Pillow's own open-time check is off here: our check below sees the size and says it well.
    with _reading("cannot read the image header", None):
        image = Image.open(io.BytesIO(data), formats=[PIL_FORMATS[media_type]])
    try:
        check_pixels(image.width, image.height, max_pixels, "the image")
    except InputRejected:
        image.close()
        raise
    return image, media_type


def _frame_count(image: Image.Image, media_type: str) -> int:
    return int(getattr(image, "n_frames", 1)) if media_type in MULTI_PAGE else 1


def probe_image(data: bytes, *, max_pixels: int | None = None) -> tuple[str, int]:
    """(media type, page count) from headers alone, with every page checked against
    `max_pixels`; decodes no pixel data."""
    image, media_type = _open(data, max_pixels)
    with image, _reading("cannot read the frames", max_pixels):
        count = _frame_count(image, media_type)
        for index in range(1, count):
            image.seek(index)
            check_pixels(image.width, image.height, max_pixels, f"frame {index + 1}")
    return media_type, count


def iter_frames(data: bytes, *, max_pixels: int | None = None) -> Iterator[Image.Image]:
    """Each page of an image file as RGB: every frame of TIFF/GIF, the first of others.

    Frames are decoded one at a time, so a long TIFF never sits in memory whole.
    """
    image, media_type = _open(data, max_pixels)
    with image:
        with _reading("cannot read the frames", max_pixels):
            count = _frame_count(image, media_type)
        for index in range(count):
            where = f"frame {index + 1}"
            with _reading(f"cannot decode {where}", max_pixels):
                image.seek(index)
                check_pixels(image.width, image.height, max_pixels, where)
                image.load()
                page = to_rgb(ImageOps.exif_transpose(image))
            yield page


def load_image(data: bytes, *, max_pixels: int | None = None) -> Image.Image:
    """Decode one image (its first frame) to RGB, EXIF orientation applied.

    `max_pixels` None means no pixel limit: right for page images this project wrote under
    a limit; pass the settings' limit for bytes from outside.
    """
    frames = iter_frames(data, max_pixels=max_pixels)
    try:
        return next(frames)
    finally:
        frames.close()


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB for every Pillow mode: transparency composited over white (a page's paper, where
    black would hide black text), wide integer and float modes scaled rather than clipped."""
    mode = image.mode
    if mode == "RGB" and not image.has_transparency_data:
        return image
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        return Image.fromarray(_wide_to_uint8(np.asarray(image))).convert("RGB")
    if image.has_transparency_data:
        rgba = image.convert("RGBA")
        page = Image.new("RGB", image.size, WHITE)
        page.paste(rgba, mask=rgba.getchannel("A"))
        return page
    # CMYK, 1, L, P, YCbCr, LAB, HSV: Pillow's own conversions are right for these.
    return image.convert("RGB")


def _wide_to_uint8(values: np.ndarray) -> np.ndarray:
    """16-bit samples to 8-bit by rounding v/257 (65535 -> 255, exact on 257*k).

    32-bit integers inside 0..65535 are 16-bit data held in a wider mode; floats inside
    0..1 are fractions of white; any other range is stretched from its own min to its max.
    """
    if values.dtype.kind == "f":
        values = np.nan_to_num(values.astype(np.float64))
    if values.size == 0:
        return values.astype(np.uint8)
    low, high = values.min(), values.max()
    if values.dtype.kind in "ui" and low >= 0 and high <= 65535:
        return ((values.astype(np.uint32) + 128) // 257).astype(np.uint8)
    if values.dtype.kind == "f" and low >= 0.0 and high <= 1.0:
        return np.rint(values * 255.0).astype(np.uint8)
    if high <= low:
        return np.zeros(values.shape, dtype=np.uint8)
    scale = 255.0 / (float(high) - float(low))
    return np.rint((values.astype(np.float64) - float(low)) * scale).astype(np.uint8)


def encode_png(image: Image.Image) -> bytes:
    """PNG bytes for a page image: fast compression (pages are written once per run, read
    once per engine), no metadata, so the same pixels always give the same bytes."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()
