"""The frozen renderer: same pixels every time, text inside its box, real glyphs, grids,
mathtext, and clear errors for what cannot be drawn."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from ocrfleet.config import Settings
from ocrfleet.ir import Category
from ocrfleet.scorers.render import (
    FontNotFoundError,
    RenderError,
    content_bounds,
    render,
    renderer_version,
)
from ocrfleet.scorers.render.fonts import load_font

FONT = Settings().render_font_path

pytestmark = pytest.mark.skipif(not FONT.is_file(), reason=f"render font missing: {FONT}")


def ink(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("L")) < 128


def test_content_bounds_is_the_ink_box() -> None:
    crop = Image.new("RGB", (120, 50), (250, 250, 245))
    ImageDraw.Draw(crop).rectangle((17, 9, 80, 30), fill=(10, 10, 10))
    assert content_bounds(crop) == (17, 9, 81, 31)
    # Dark page, light ink: the background is the border's colour, not "white".
    dark = Image.new("RGB", (40, 40), (0, 0, 0))
    ImageDraw.Draw(dark).rectangle((5, 6, 9, 30), fill=(255, 255, 255))
    assert content_bounds(dark) == (5, 6, 10, 31)
    assert content_bounds(Image.new("RGB", (30, 20), "white")) == (0, 0, 30, 20)


@pytest.mark.parametrize(
    ("text", "category"),
    [
        ("Invoice 2024-03 总计 ¥1,234.00\nsecond line", Category.text),
        (r"\frac{a+b}{c^2} = \sum_{i=1}^{n} x_i", Category.formula),
        (
            "<table><tr><td>a</td><td>b</td></tr><tr><td colspan=2>c</td></tr></table>",
            Category.table,
        ),
    ],
)
def test_same_input_gives_identical_pixels(text: str, category: Category) -> None:
    first = render(text, category, (320, 90), (12, 8, 300, 80))
    load_font.cache_clear()
    second = render(text, category, (320, 90), (12, 8, 300, 80))
    assert first.mode == "RGB" and first.size == (320, 90)
    assert first.tobytes() == second.tobytes()
    assert ink(first).any()


@pytest.mark.parametrize(
    "box", [(0, 0, 400, 60), (30, 10, 200, 50), (5, 5, 60, 200), (100, 20, 390, 28)]
)
def test_text_fits_its_box_tightly(box: tuple[int, int, int, int]) -> None:
    image = render(
        "The quick brown fox jumps over the lazy dog 1234", Category.text, (400, 220), box
    )
    x0, y0, x1, y1 = content_bounds(image)
    assert box[0] <= x0 and box[1] <= y0 and x1 <= box[2] and y1 <= box[3]
    # The largest size that fits: the ink fills the box in at least one direction.
    width, height = box[2] - box[0], box[3] - box[1]
    assert (x1 - x0) >= 0.8 * width or (y1 - y0) >= 0.8 * height


def test_explicit_newlines_make_lines() -> None:
    one = ink(render("alpha beta", Category.text, (300, 120)))
    two = ink(render("alpha\nbeta", Category.text, (300, 120)))
    rows_with_ink = lambda mask: np.flatnonzero(mask.any(axis=1))  # noqa: E731
    gaps = lambda rows: int((np.diff(rows) > 1).sum())  # noqa: E731
    assert gaps(rows_with_ink(two)) > gaps(rows_with_ink(one))


def test_cjk_renders_real_glyphs() -> None:
    # A font without CJK draws the same empty box (tofu) for every character.
    images = [ink(render(char, Category.text, (64, 64))) for char in "汉字表格"]
    assert all(mask.sum() > 50 for mask in images)
    for index, mask in enumerate(images):
        for other in images[index + 1 :]:
            assert (mask != other).sum() > 50


def _full_lines(mask: np.ndarray, axis: int, fraction: float = 0.95) -> int:
    """How many separate runs of rows (axis=1) or columns (axis=0) are inked edge to edge."""
    full = np.flatnonzero(mask.mean(axis=axis) >= fraction)
    return 0 if full.size == 0 else int((np.diff(full) > 1).sum()) + 1


def test_html_table_draws_its_grid() -> None:
    html = (
        "<table><tr><th>Item</th><th>Qty</th><th>Price</th></tr>"
        "<tr><td>Apple</td><td>3</td><td>1.20</td></tr>"
        "<tr><td>梨</td><td>10</td><td>&lt;5&gt;</td></tr></table>"
    )
    mask = ink(render(html, Category.table, (300, 120), (10, 10, 290, 110)))[10:110, 10:290]
    assert _full_lines(mask, axis=1) == 4  # horizontal rules: top, two between rows, bottom
    assert _full_lines(mask, axis=0) == 4  # vertical rules: left, two between columns, right


def test_colspan_removes_the_rule_it_spans() -> None:
    plain = "<table><tr><td>a</td><td>b</td></tr><tr><td>c</td><td>d</td></tr></table>"
    spanned = "<table><tr><td colspan='2'>ab</td></tr><tr><td>c</td><td>d</td></tr></table>"
    box = (0, 0, 200, 80)
    assert _full_lines(ink(render(plain, Category.table, (200, 80), box)), axis=0) == 3
    assert _full_lines(ink(render(spanned, Category.table, (200, 80), box)), axis=0) == 2


@pytest.mark.parametrize(
    "html",
    [
        "just words, no table",
        "<table><tr><td>a</td></tr>",  # never closed
        "<table><tr><td>a</td></tr></table><table><tr><td>b</td></tr></table>",
        "<table><td>a</td></table>",  # cell outside a row
        "<table><tr><td>a</td></td></tr></table>",  # unmatched </td>
        "<table><tr><td colspan='x'>a</td></tr></table>",
        "<table><tr><td rowspan='0'>a</td></tr></table>",
        "<table></table>",
        "<table><tr><td><table><tr><td>x</td></tr></table></td></tr></table>",
        "<table><tr><td>a</td></tr></table> trailing text",
    ],
)
def test_malformed_table_html_is_a_render_error(html: str) -> None:
    with pytest.raises(RenderError, match="table"):
        render(html, Category.table, (200, 80))


def test_valid_latex_renders_inside_its_box() -> None:
    box = (20, 10, 280, 70)
    image = render(r"$$E = mc^2 + \int_0^1 \sqrt{x}\,dx$$", Category.formula, (300, 80), box)
    x0, y0, x1, y1 = content_bounds(image)
    assert box[0] <= x0 and box[1] <= y0 and x1 <= box[2] and y1 <= box[3]
    assert (x1 - x0) >= 0.8 * (box[2] - box[0]) or (y1 - y0) >= 0.8 * (box[3] - box[1])
    other = render(r"E = mc^3 + \int_0^1 \sqrt{x}\,dx", Category.formula, (300, 80), box)
    assert image.tobytes() != other.tobytes()


@pytest.mark.parametrize(
    "latex",
    [r"\frac{a}{", r"\begin{aligned} a &= b \end{aligned}", r"x^{2", r"\notacommand{x}", "a $ b"],
)
def test_bad_latex_is_a_render_error(latex: str) -> None:
    with pytest.raises(RenderError, match="formula"):
        render(latex, Category.formula, (200, 60))


def test_empty_inputs_are_render_errors() -> None:
    with pytest.raises(RenderError):
        render("   ", Category.text, (100, 40))
    with pytest.raises(RenderError):
        render("x", Category.text, (0, 40))
    with pytest.raises(RenderError):
        render("x", Category.text, (100, 40), (50, 10, 50, 30))


def test_version_names_the_font_hash(tmp_path: Path) -> None:
    version = renderer_version(FONT)
    assert hashlib.sha256(FONT.read_bytes()).hexdigest()[:16] in version
    import matplotlib

    assert matplotlib.__version__ in version
    assert renderer_version(FONT) is version  # computed once
    # Another font file is another renderer.
    other = tmp_path / "other.ttc"
    shutil.copyfile(FONT, other)
    with other.open("ab") as handle:
        handle.write(b"\0")
    assert renderer_version(other) != version


def test_missing_font_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.ttc"
    with pytest.raises(FontNotFoundError, match="nope.ttc"):
        renderer_version(missing)
    with pytest.raises(FontNotFoundError):
        render("x", Category.text, (40, 20), font_path=missing)
