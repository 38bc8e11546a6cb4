"""The one loader: image mode conversions on real pixels, EXIF orientation, multi-page
inputs, PDF rendering at the DPI, and every bad input rejected with its own reason."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ocrfleet.config import Settings
from ocrfleet.pipeline.images import encode_png, load_image
from ocrfleet.pipeline.split import (
    InputRejected,
    iter_pages,
    open_document,
    pdf_page_pixels,
    sniff_media_type,
)
from tests.conftest import REALDOCS
from tests.fixtures.badinputs import BadInput, cases, pdf_bytes, png_bytes

# Any warning is a failure: a decompression-bomb warning must never escape the loader.
pytestmark = pytest.mark.filterwarnings("error")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WHITE = (255, 255, 255)


def encoded(image: Image.Image, fmt: str, **params: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **params)
    return out.getvalue()


def pixels(image: Image.Image) -> list[tuple[int, int, int]]:
    assert image.mode == "RGB"
    return [tuple(int(v) for v in px) for px in np.asarray(image).reshape(-1, 3)]


def near(actual: tuple[int, ...], expected: tuple[int, ...], tolerance: int = 1) -> bool:
    return all(abs(a - e) <= tolerance for a, e in zip(actual, expected, strict=True))


# --- mode conversions -------------------------------------------------------------------


def palette_image() -> Image.Image:
    image = Image.new("P", (4, 1))
    image.putpalette([0, 0, 0, 255, 0, 0, 0, 0, 255] + [0, 0, 0] * 253)
    image.putdata([0, 1, 2, 0])
    return image


def test_palette_transparent_index_is_white_not_its_black_colour() -> None:
    data = png_bytes(palette_image(), transparency=0)
    assert pixels(load_image(data)) == [WHITE, (255, 0, 0), (0, 0, 255), WHITE]


def test_palette_partial_alpha_composites_over_white() -> None:
    data = png_bytes(palette_image(), transparency=bytes([0, 255, 128]))
    got = pixels(load_image(data))
    assert got[:2] == [WHITE, (255, 0, 0)]
    assert near(got[2], (127, 127, 255))


def test_gif_transparency_is_white() -> None:
    data = encoded(palette_image(), "GIF", transparency=0)
    assert pixels(load_image(data)) == [WHITE, (255, 0, 0), (0, 0, 255), WHITE]


def test_la_composites_over_white() -> None:
    image = Image.new("LA", (3, 1))
    image.putdata([(0, 0), (50, 255), (0, 128)])
    got = pixels(load_image(png_bytes(image)))
    assert got[:2] == [WHITE, (50, 50, 50)]
    assert near(got[2], (127, 127, 127))


def test_rgba_composites_over_white_not_black() -> None:
    image = Image.new("RGBA", (3, 1))
    image.putdata([(0, 0, 0, 0), (255, 0, 0, 128), (0, 0, 255, 255)])
    got = pixels(load_image(png_bytes(image)))
    assert got[0] == WHITE
    assert near(got[1], (255, 127, 127))
    assert got[2] == (0, 0, 255)


def test_rgb_colour_key_transparency_is_white() -> None:
    image = Image.new("RGB", (2, 1))
    image.putdata([(10, 20, 30), (200, 0, 0)])
    assert pixels(load_image(png_bytes(image, transparency=(10, 20, 30)))) == [
        WHITE,
        (200, 0, 0),
    ]


CMYK_CASES = [
    ((0, 0, 0, 0), WHITE),
    ((0, 0, 0, 255), (0, 0, 0)),
    ((255, 0, 0, 0), (0, 255, 255)),
    ((0, 255, 0, 0), (255, 0, 255)),
    ((0, 0, 255, 0), (255, 255, 0)),
]


def test_cmyk_tiff_to_rgb() -> None:
    image = Image.new("CMYK", (len(CMYK_CASES), 1))
    image.putdata([cmyk for cmyk, _ in CMYK_CASES])
    assert pixels(load_image(encoded(image, "TIFF"))) == [rgb for _, rgb in CMYK_CASES]


@pytest.mark.parametrize(("cmyk", "rgb"), CMYK_CASES)
def test_cmyk_jpeg_to_rgb(cmyk: tuple[int, ...], rgb: tuple[int, int, int]) -> None:
    data = encoded(Image.new("CMYK", (16, 16), cmyk), "JPEG", quality=95)
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    got = load_image(data)
    assert near(got.getpixel((8, 8)), rgb, tolerance=6)


SIXTEEN_BIT = np.array([[0, 257 * 100, 32896, 65535, 300]], dtype=np.uint16)
EIGHT_BIT = [0, 100, 128, 255, 1]  # scaled, not clipped: 25700 -> 100, not 255


def test_16_bit_png_scales_to_8_bit() -> None:
    data = png_bytes(Image.fromarray(SIXTEEN_BIT))
    assert Image.open(io.BytesIO(data)).mode.startswith("I")
    assert [p[0] for p in pixels(load_image(data))] == EIGHT_BIT


def test_16_bit_tiff_scales_to_8_bit() -> None:
    data = encoded(Image.fromarray(SIXTEEN_BIT), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    got = pixels(load_image(data))
    assert [p[0] for p in got] == EIGHT_BIT
    assert all(p[0] == p[1] == p[2] for p in got)


def test_32_bit_integer_tiff_out_of_16_bit_range_is_stretched() -> None:
    values = np.array([[-1000, 0, 99000]], dtype=np.int32)
    data = encoded(Image.fromarray(values), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "I"
    assert [p[0] for p in pixels(load_image(data))] == [0, 3, 255]


def test_float_tiff_in_unit_range() -> None:
    data = encoded(Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32)), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "F"
    assert [p[0] for p in pixels(load_image(data))] == [0, 128, 255]


def test_1_bit_png_and_group4_tiff() -> None:
    image = Image.new("1", (2, 1))
    image.putdata([0, 255])
    assert pixels(load_image(png_bytes(image))) == [(0, 0, 0), WHITE]
    tiff = encoded(image, "TIFF", compression="group4")
    assert pixels(load_image(tiff)) == [(0, 0, 0), WHITE]


def test_grayscale_and_rgb_pass_through() -> None:
    gray = Image.new("L", (2, 1))
    gray.putdata([7, 200])
    assert pixels(load_image(png_bytes(gray))) == [(7, 7, 7), (200, 200, 200)]
    bmp = encoded(Image.new("RGB", (2, 2), (1, 2, 3)), "BMP")
    assert pixels(load_image(bmp)) == [(1, 2, 3)] * 4
    webp = encoded(Image.new("RGB", (8, 8), (250, 10, 10)), "WEBP", lossless=True)
    assert pixels(load_image(webp)) == [(250, 10, 10)] * 64


# --- EXIF orientation -------------------------------------------------------------------

QUADRANTS = {(0, 0): (255, 0, 0), (1, 0): (0, 255, 0), (0, 1): (0, 0, 255), (1, 1): (0, 0, 0)}
# Orientation tag -> the transpose that stores an upright picture under that tag.
STORE = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def upright() -> Image.Image:
    """40x20, four coloured quadrants: any wrong turn or flip moves a colour."""
    image = Image.new("RGB", (40, 20))
    for (col, row), colour in QUADRANTS.items():
        image.paste(colour, (col * 20, row * 10, col * 20 + 20, row * 10 + 10))
    return image


def stored(orientation: int, fmt: str, **params: object) -> bytes:
    image = upright()
    if STORE[orientation] is not None:
        image = image.transpose(STORE[orientation])
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encoded(image, fmt, exif=exif.tobytes(), **params)


def assert_upright(image: Image.Image, tolerance: int = 0) -> None:
    assert image.size == (40, 20)
    for (col, row), colour in QUADRANTS.items():
        got = image.getpixel((col * 20 + 10, row * 10 + 5))
        assert near(got, colour, tolerance), ((col, row), got, colour)


@pytest.mark.parametrize("orientation", sorted(STORE))
def test_exif_orientation_png(orientation: int) -> None:
    assert_upright(load_image(stored(orientation, "PNG")))


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_orientation_jpeg(orientation: int) -> None:
    data = stored(orientation, "JPEG", quality=95)
    raw = Image.open(io.BytesIO(data))
    assert raw.size == ((20, 40) if orientation in (6, 8) else (40, 20))
    assert_upright(load_image(data), tolerance=12)


def test_example_photo_is_stored_sideways_and_loads_upright() -> None:
    data = (EXAMPLES / "photo.jpg").read_bytes()
    assert Image.open(io.BytesIO(data)).size == (520, 900)
    assert load_image(data).size == (900, 520)


# --- multi-page images ------------------------------------------------------------------


def test_multi_frame_tiff_gives_one_page_per_frame() -> None:
    frames = [
        Image.new("RGB", (30, 20), (255, 0, 0)),
        Image.new("L", (50, 10), 90),
        Image.new("1", (12, 34), 0),
    ]
    data = encoded(frames[0], "TIFF", save_all=True, append_images=frames[1:])
    settings = Settings()
    document = open_document(data, settings, "s3://bucket/intake/a.tif")
    assert (document.media_type, document.page_count) == ("image/tiff", 3)
    pages = list(iter_pages(data, settings))
    assert [page.size for page in pages] == [(30, 20), (50, 10), (12, 34)]
    assert [page.getpixel((5, 5)) for page in pages] == [(255, 0, 0), (90, 90, 90), (0, 0, 0)]
    assert {page.mode for page in pages} == {"RGB"}


def test_multi_frame_gif_gives_one_page_per_frame() -> None:
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]
    frames = [Image.new("RGB", (16, 16), colour) for colour in colours]
    data = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)
    assert open_document(data, Settings(), "a.gif").page_count == 4
    pages = list(iter_pages(data, Settings()))
    assert [page.getpixel((8, 8)) for page in pages] == colours


def test_single_frame_formats_give_one_page() -> None:
    data = png_bytes(Image.new("RGB", (10, 10), "white"))
    assert open_document(data, Settings(), "a.png").page_count == 1
    assert len(list(iter_pages(data, Settings()))) == 1


def test_example_memo_tiff_has_two_pages() -> None:
    data = (EXAMPLES / "memo.tif").read_bytes()
    assert open_document(data, Settings(), "memo.tif").page_count == 2
    assert len(list(iter_pages(data, Settings()))) == 2


# --- PDF --------------------------------------------------------------------------------


def mixed_size_pdf() -> bytes:
    from fpdf import FPDF

    pdf = FPDF(unit="pt", format="A4")
    pdf.set_font("helvetica", size=24)
    for size in [(595.28, 841.89), (612, 792), (300, 120)]:
        pdf.add_page(format=size)
        pdf.cell(text="Hello")
    return bytes(pdf.output())


@pytest.mark.parametrize("dpi", [72, 100, 200])
def test_pdf_pages_render_at_the_dpi(dpi: int) -> None:
    data = mixed_size_pdf()
    settings = Settings(dpi=dpi)
    document = open_document(data, settings, "s3://bucket/intake/mixed.pdf")
    assert document.page_count == 3
    assert document.media_type == "application/pdf"
    pages = list(iter_pages(data, settings))
    expected = [pdf_page_pixels(w, h, dpi) for w, h in [(595.28, 841.89), (612, 792), (300, 120)]]
    assert [page.size for page in pages] == expected
    for page in pages:
        assert page.mode == "RGB"
        values = np.asarray(page)
        assert values.min() < 80  # the text is drawn
        assert values.max() == 255  # on a white page
    if dpi == 100:
        assert expected[0] == (827, 1170)


def test_pdf_page_rotation_swaps_rendered_size() -> None:
    import pikepdf

    with pikepdf.open(io.BytesIO(pdf_bytes(pages=1, size=(200, 300)))) as pdf:
        pdf.pages[0].Rotate = 90
        out = io.BytesIO()
        pdf.save(out)
    (page,) = iter_pages(out.getvalue(), Settings(dpi=144))
    assert page.size == (600, 400)


def test_owner_password_only_pdf_is_not_rejected() -> None:
    data = pdf_bytes(pages=2, owner_password="owner-only")
    assert open_document(data, Settings(), "o.pdf").page_count == 2
    assert len(list(iter_pages(data, Settings(dpi=50)))) == 2


def test_pdf_rendering_stops_cleanly_when_abandoned() -> None:
    data = pdf_bytes(pages=5)
    pages = iter_pages(data, Settings(dpi=50))
    first = next(pages)
    pages.close()
    assert first.size == pdf_page_pixels(595.28, 841.89, 50)
    # PDFium is usable again at once: the abandoned document was closed.
    assert open_document(data, Settings(), "again.pdf").page_count == 5


def test_document_records_hash_type_size_and_pages() -> None:
    data = (EXAMPLES / "letter.pdf").read_bytes()
    document = open_document(data, Settings(), "file:///examples/letter.pdf")
    assert document.sha256 == hashlib.sha256(data).hexdigest()
    assert document.byte_size == len(data)
    assert document.media_type == "application/pdf"
    assert document.page_count == 2
    assert document.source_uri == "file:///examples/letter.pdf"


def test_pdf_with_junk_before_header_and_nul_padding_after_eof_opens() -> None:
    data = b"\r\n" * 10 + pdf_bytes(pages=1) + b"\x00" * 4096
    assert sniff_media_type(data) == "application/pdf"
    assert open_document(data, Settings(), "padded.pdf").page_count == 1


# --- sniffing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "media_type"),
    [
        ("PNG", "image/png"),
        ("JPEG", "image/jpeg"),
        ("TIFF", "image/tiff"),
        ("GIF", "image/gif"),
        ("WEBP", "image/webp"),
        ("BMP", "image/bmp"),
    ],
)
def test_sniff_image_types(fmt: str, media_type: str) -> None:
    assert sniff_media_type(encoded(Image.new("RGB", (4, 4)), fmt)) == media_type


def test_png_with_pdf_marker_in_its_text_stays_a_png() -> None:
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "scanned from %PDF-1.4 original")
    data = png_bytes(Image.new("RGB", (4, 4), "white"), pnginfo=info)
    assert b"%PDF-" in data[:1024]
    assert sniff_media_type(data) == "image/png"


def test_sniff_ignores_the_name_and_reads_the_bytes() -> None:
    data = png_bytes(Image.new("RGB", (4, 4)))
    document = open_document(data, Settings(), "s3://bucket/intake/scan.pdf")
    assert document.media_type == "image/png"


# --- bad inputs -------------------------------------------------------------------------

BAD = cases()


def rejection(case: BadInput) -> InputRejected:
    """Validation or rendering must reject it; it may never be accepted or crash."""
    settings = Settings(**case.settings)
    with pytest.raises(InputRejected) as caught:
        open_document(case.data, settings, f"test://{case.name}")
        for _ in iter_pages(case.data, settings):
            pass
    return caught.value


@pytest.mark.parametrize("case", BAD, ids=[case.name for case in BAD])
def test_bad_input_is_rejected_with_its_reason(case: BadInput) -> None:
    error = rejection(case)
    assert error.reason == case.reason, str(error)
    assert str(error) == f"{error.reason}: {error.detail}"
    assert error.detail


@pytest.mark.parametrize("case", BAD, ids=[case.name for case in BAD])
def test_bad_input_is_rejected_by_iter_pages_alone(case: BadInput) -> None:
    """iter_pages re-checks, so bytes that skipped open_document are still safe."""
    with pytest.raises(InputRejected) as caught:
        list(iter_pages(case.data, Settings(**case.settings)))
    assert caught.value.reason == case.reason


def test_rejections_are_found_before_rendering_where_headers_tell() -> None:
    header_only = {case.name for case in BAD} - {"png_garbage_pixels"}
    for case in BAD:
        if case.name in header_only:
            with pytest.raises(InputRejected):
                open_document(case.data, Settings(**case.settings), "x")


def test_the_same_inputs_pass_under_default_limits() -> None:
    """The limit cases are bad only because of their small limit."""
    for case in BAD:
        if case.reason in {"too_large", "too_many_pixels", "too_many_pages"}:
            document = open_document(case.data, Settings(), "x")
            assert document.page_count >= 1


def test_limit_details_name_the_value_and_the_limit() -> None:
    by_name = {case.name: case for case in BAD}
    assert (
        "3 pages, over the limit of 2 (max_pages)"
        in rejection(by_name["pdf_over_page_limit"]).detail
    )
    assert (
        "300x200 = 60000 pixels, over the limit of 50000"
        in rejection(by_name["png_over_pixel_limit"]).detail
    )
    assert "at 200 dpi is 1654x2339" in rejection(by_name["pdf_over_pixel_limit"]).detail


def test_input_rejected_survives_pickling() -> None:
    error = InputRejected("too_many_pages", "the document has 3 pages")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.reason, copy.detail, str(copy)) == (error.reason, error.detail, str(error))


def test_truncated_real_pdfs_are_truncated_not_corrupt() -> None:
    pdfs = sorted((REALDOCS / "olmocr_bench_sample" / "pdfs").glob("*.pdf"))
    if not pdfs:
        pytest.skip(f"no real PDFs under {REALDOCS}")
    settings = Settings(dpi=36)
    for path in pdfs:
        data = path.read_bytes()
        assert open_document(data, settings, str(path)).page_count >= 1
        with pytest.raises(InputRejected) as caught:
            open_document(data[: len(data) // 2], settings, str(path))
        assert caught.value.reason == "truncated_pdf", path.name


def test_real_1_bit_scan_loads() -> None:
    path = REALDOCS / "tesseract_test" / "8087_054.3B.tif"
    if not path.is_file():
        pytest.skip(f"missing {path}")
    (page,) = iter_pages(path.read_bytes(), Settings())
    values = np.asarray(page)
    assert page.mode == "RGB" and set(np.unique(values)) <= {0, 255}


# --- Pillow's own decompression-bomb checks ---------------------------------------------


def gif_with_oversized_second_frame(width: int, height: int) -> bytes:
    """A 10x10 GIF whose second frame's descriptor claims width x height: Pillow grows the
    canvas while seeking, so its own bomb check (not ours) is what fires."""
    frames = [Image.new("P", (10, 10), 0), Image.new("P", (10, 10), 1)]
    for frame in frames:
        frame.putpalette([255, 0, 0, 0, 0, 255] + [0, 0, 0] * 254)
    data = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], optimize=False)
    descriptor = b"\x2c\x00\x00\x00\x00\x0a\x00\x0a\x00"
    at = data.rindex(descriptor)
    size = width.to_bytes(2, "little") + height.to_bytes(2, "little")
    return data[: at + 5] + size + data[at + 9 :]


@pytest.mark.parametrize(("width", "height"), [(150, 100), (400, 400)])
def test_pillow_bomb_warning_and_error_become_rejections(width: int, height: int) -> None:
    """150x100 is past the limit (Pillow warns), 400x400 past twice it (Pillow raises)."""
    limit_before = Image.MAX_IMAGE_PIXELS
    data = gif_with_oversized_second_frame(width, height)
    settings = Settings(max_pixels=10_000)
    for attempt in (
        lambda: open_document(data, settings, "bomb.gif"),
        lambda: list(iter_pages(data, settings)),
    ):
        with pytest.raises(InputRejected) as caught:
            attempt()
        assert caught.value.reason == "too_many_pixels"
        assert f"{width * height} pixels" in caught.value.detail
    assert limit_before == Image.MAX_IMAGE_PIXELS  # nothing leaks into the process
    assert load_image(data).size == (10, 10)  # first frame alone is fine without a limit


def test_limit_above_pillows_default_does_not_warn() -> None:
    """Pillow warns past ~89.5 MP by default; a higher configured limit must be honoured
    silently (checked on a header, so nothing that large is decoded)."""
    data = encoded(Image.new("1", (10_000, 9_500)), "PNG")
    assert Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < 95_000_000
    document = open_document(data, Settings(max_pixels=100_000_000), "big.png")
    assert document.page_count == 1
    with pytest.raises(InputRejected) as caught:
        open_document(data, Settings(max_pixels=90_000_000), "big.png")
    assert caught.value.reason == "too_many_pixels"


# --- page PNGs and examples -------------------------------------------------------------


def test_encode_png_round_trips_and_is_deterministic() -> None:
    rng = np.random.default_rng(3)
    image = Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8))
    data = encode_png(image)
    assert data == encode_png(image.copy())
    assert np.array_equal(np.asarray(load_image(data)), np.asarray(image))


def load_generator():
    spec = importlib.util.spec_from_file_location("make_examples", EXAMPLES / "make_examples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_examples_match_their_ground_truth_page_counts() -> None:
    for truth in sorted(EXAMPLES.glob("*.gt.txt")):
        source = truth.with_name(truth.name.removesuffix(".gt.txt"))
        data = source.read_bytes()
        expected_pages = truth.read_text(encoding="utf-8").count("\f") + 1
        assert open_document(data, Settings(), str(source)).page_count == expected_pages
        assert len(list(iter_pages(data, Settings(dpi=72)))) == expected_pages


def test_example_generator_is_deterministic(tmp_path: Path) -> None:
    generator = load_generator()
    first = generator.build(tmp_path / "a")
    generator.build(tmp_path / "b")
    assert set(first) == {"letter.pdf", "scan.png", "photo.jpg", "memo.tif"}
    for name in first:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / f"{name}.gt.txt").read_text() == (
            EXAMPLES / f"{name}.gt.txt"
        ).read_text()


def test_example_pdf_text_layer_is_the_ground_truth() -> None:
    import pypdfium2 as pdfium

    truth = (EXAMPLES / "letter.pdf.gt.txt").read_text(encoding="utf-8").split("\f")
    pdf = pdfium.PdfDocument((EXAMPLES / "letter.pdf").read_bytes())
    try:
        for index, expected in enumerate(truth):
            page = pdf[index]
            textpage = page.get_textpage()
            assert textpage.get_text_range().replace("\r\n", "\n") == expected
            textpage.close()
            page.close()
    finally:
        pdf.close()
