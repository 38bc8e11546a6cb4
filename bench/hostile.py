"""A hostile-input corpus, and what `ocrfleet run` makes of it: kind -> state -> reason.

`build(folder)` writes every kind into `folder` (real writers: Pillow, fpdf2, pikepdf, and
bytes cut or forged by hand) and returns what each must end as. The tests run it through
`ocrfleet run` and through the fleet with real workers; this script runs it through
`ocrfleet run` and prints the table:

    python bench/hostile.py [--keep DIR]

Settings the corpus needs (`SETTINGS`): a page limit of 20 and a byte limit of 8 MiB, so
the "over a limit" kinds stay small, and a render budget of 1 GiB, so the PDF bombs (a few
KB each) are rejected within seconds. The file `zz-vanished.png` is meant to be deleted after
`ocrfleet run` has listed it and before it reads it (`vanish_when_listed`).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixtures.badinputs import (  # noqa: E402
    empty_pdf_bytes,
    linearized_pdf_bytes,
    pdf_bytes,
    png_garbage_after_header,
    png_garbage_pixels,
)

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
SETTINGS = {
    "OCRFLEET_MAX_PAGES": "20",
    "OCRFLEET_MAX_INPUT_BYTES": str(8 * 1024 * 1024),
    "OCRFLEET_RENDER_MEMORY_MB": "1024",
}
VANISHED = "zz-vanished.png"
LARGE_LINE = "Quarterly revenue grew by seventeen percent"
NON_UTF8_NAME = b"scan-\xff\xfe-latin1-\xe9.png"


@dataclass(frozen=True)
class Kind:
    name: str
    filename: str  # may hold surrogate escapes (a name that is not UTF-8)
    state: str  # done | rejected | skipped
    reason: str = ""  # reason code the row must start with (rejected), or why (skipped)
    text: str = ""  # a line that must be read (done)


def _text_image(lines: list[str], size: tuple[int, int] = (520, 150), font: int = 28):
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    face = ImageFont.truetype(FONT, font)
    for row, line in enumerate(lines):
        draw.text((20, 20 + row * int(font * 1.8)), line, fill="black", font=face)
    return image


def _save(image: Image.Image, fmt: str, **params: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **params)
    return out.getvalue()


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")


def png_pixel_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    """A PNG whose header claims 10 gigapixels, in a few hundred bytes."""
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([1, 0, 0, 0, 0])
    idat = zlib.compress(b"\x00" * 64)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", idat)
        + _png_chunk(b"IEND", b"")
    )


def tiff_truncated_third_frame() -> bytes:
    """A three-frame TIFF cut in the middle of the third frame's pixel data."""
    frames = [_text_image([f"Frame {n} of a memo"]).convert("L") for n in (1, 2, 3)]
    data = _save(frames[0], "TIFF", save_all=True, append_images=frames[1:])
    with Image.open(io.BytesIO(data)) as tiff:
        tiff.seek(2)
        offset = tiff.tag_v2[273][0]  # StripOffsets of frame 3
    return data[: offset + 200]


def pdf_rotated(rotate: int, line: str) -> bytes:
    """Upright text on a page whose /Rotate turns it sideways for every viewer."""
    import pikepdf
    from fpdf import FPDF

    pdf = FPDF(unit="pt", format=(420, 160))
    pdf.set_font("helvetica", size=24)
    pdf.add_page()
    pdf.text(20, 60, line)
    with pikepdf.open(io.BytesIO(bytes(pdf.output()))) as doc:
        doc.pages[0].obj["/Rotate"] = rotate
        out = io.BytesIO()
        doc.save(out)
        return out.getvalue()


def pdf_xobject_bomb(depth: int, fanout: int = 8) -> bytes:
    """A page that draws a Form XObject `fanout` times, which draws the one below it
    `fanout` times, `depth` levels deep: about 2 KB that ask PDFium for fanout**depth
    draws (depth 7: seconds and gigabytes; depth 8: minutes)."""
    import pikepdf
    from pikepdf import Array, Dictionary, Name, Stream

    pdf = pikepdf.new()
    form = Stream(pdf, b"0 0 m 10 10 l 10 0 l h f 2 2 8 8 re S")
    form.Type, form.Subtype, form.BBox = Name.XObject, Name.Form, Array([0, 0, 10, 10])
    for _ in range(depth):
        draws = b"".join(b"q 0.5 0 0 0.5 %d %d cm /X Do Q " % (i, i) for i in range(fanout))
        outer = Stream(pdf, draws)
        outer.Type, outer.Subtype, outer.BBox = Name.XObject, Name.Form, Array([0, 0, 100, 100])
        outer.Resources = Dictionary(XObject=Dictionary(X=form))
        form = outer
    page = Dictionary(
        Type=Name.Page,
        MediaBox=Array([0, 0, 200, 200]),
        Contents=Stream(pdf, b"/X Do"),
        Resources=Dictionary(XObject=Dictionary(X=form)),
    )
    pdf.pages.append(pikepdf.Page(page))
    out = io.BytesIO()
    pdf.save(out, object_stream_mode=pikepdf.ObjectStreamMode.generate)
    return out.getvalue()


def pdf_inflate_bomb(megabytes: int = 1024) -> bytes:
    """A page whose content stream is deflated twice: about 15 KB that inflate to
    `megabytes` MiB of drawing operators (the first pass at level 1: built in seconds)."""
    import pikepdf
    from pikepdf import Array, Dictionary, Name, Stream

    once = zlib.compressobj(1)
    block = b"0 0 m 1 1 l S\n" * 74_898  # 1 MiB, to the byte
    deflated = b"".join(once.compress(block) for _ in range(megabytes)) + once.flush()
    pdf = pikepdf.new()
    contents = Stream(pdf, b"")
    contents.write(zlib.compress(deflated, 9), filter=Array([Name.FlateDecode] * 2))
    page = Dictionary(Type=Name.Page, MediaBox=Array([0, 0, 100, 100]), Contents=contents)
    pdf.pages.append(pikepdf.Page(page))
    out = io.BytesIO()
    pdf.save(
        out, compress_streams=False, stream_decode_level=pikepdf.StreamDecodeLevel.none
    )
    return out.getvalue()


def pdf_lying_count() -> bytes:
    """A one-page PDF whose page tree says /Count 3."""
    data = pdf_bytes(pages=1)
    return data.replace(b"/Count 1", b"/Count 3", 1)


def large_page_small_text() -> bytes:
    """7700 x 7700 (59.3 Mpx, under the default 60 Mpx limit) with one 80 px line (its box
    is about 120 px tall): detected whole at 2000 px, the line shrank to nothing."""
    image = Image.new("L", (7700, 7700), 255)
    ImageDraw.Draw(image).text((2900, 3950), LARGE_LINE, fill=0, font=ImageFont.truetype(FONT, 80))
    return _save(image, "PNG", compress_level=1)


def strip(width: int, height: int, font: int) -> bytes:
    image = Image.new("L", (width, height), 255)
    if font:
        ImageDraw.Draw(image).text(
            (20, max(0, (height - font) // 2 - 2)),
            "strip text",
            fill=0,
            font=ImageFont.truetype(FONT, font),
        )
    return _save(image, "PNG")


def kinds() -> list[tuple[Kind, bytes]]:
    """Every kind with its bytes (symlinks, folders and FIFOs are made by `build`)."""
    good = _text_image(["Invoice 4711 for harbour works", "Total due: 1,280 EUR"])
    good_png = _save(good, "PNG")
    full_pdf = pdf_bytes(pages=6)
    linear = linearized_pdf_bytes()
    jpeg = _save(good, "JPEG", quality=90)
    webp = _save(good, "WEBP", quality=90)
    exif = Image.Exif()
    exif[0x0112] = 6
    sideways = _save(good.transpose(Image.Transpose.ROTATE_90), "JPEG", exif=exif.tobytes())
    palette = good.convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    palette.info["transparency"] = 0
    wide16 = Image.fromarray(np.asarray(good.convert("L")).astype(np.uint16) * 257)
    gif_frames = [_text_image([f"Animated frame {n}"]) for n in (1, 2)]
    tiff_frames = [_text_image([f"Memo page {n}"]).convert("1") for n in (1, 2, 3)]
    polyglot = _save(good, "PNG", pnginfo=_pnginfo("%PDF-1.7 not really"))
    return [
        (Kind("zero_bytes", "empty.pdf", "rejected", "empty_file"), b""),
        (
            Kind("pdf_cut_in_half", "cut.pdf", "rejected", "truncated_pdf"),
            full_pdf[: len(full_pdf) // 2],
        ),
        (
            Kind("linearized_pdf_cut", "linear-cut.pdf", "rejected", "truncated_pdf"),
            linear[: len(linear) * 7 // 10],
        ),
        (
            Kind("pdf_garbage_body", "garbage.pdf", "rejected", "corrupt_pdf"),
            b"%PDF-1.7\n" + bytes(range(256)) * 8 + b"\nstartxref\n0\n%%EOF\n",
        ),
        (
            Kind("encrypted_pdf", "locked.pdf", "rejected", "encrypted_pdf"),
            pdf_bytes(pages=1, owner_password="o-secret", user_password="u-secret"),
        ),
        (Kind("empty_page_tree", "no-pages.pdf", "rejected", "no_pages"), empty_pdf_bytes()),
        (
            Kind("text_named_png", "notes.png", "rejected", "unsupported_type"),
            b"Quarterly report\nRevenue: 12\n" * 20,
        ),
        (
            Kind("html_named_pdf", "page.pdf", "rejected", "unsupported_type"),
            b"<!doctype html><html><body>%PDF in body</body></html>" * 50,
        ),
        (
            Kind("zip_named_pdf", "archive.pdf", "rejected", "unsupported_type"),
            _zip_bytes(),
        ),
        (
            Kind("elf_named_tif", "binary.tif", "rejected", "unsupported_type"),
            Path(sys.executable).resolve().read_bytes()[:8192],
        ),
        (
            Kind("bm_text", "bmw.bmp", "rejected", "unsupported_type"),
            b"BMW service invoice, March 2024\n" * 4,
        ),
        (
            Kind("png_garbage_after_header", "bad-chunks.png", "rejected", "corrupt_image"),
            png_garbage_after_header(),
        ),
        (
            Kind("png_garbage_pixels", "bad-idat.png", "rejected", "corrupt_image"),
            png_garbage_pixels(),
        ),
        (
            Kind("jpeg_truncated", "cut.jpg", "rejected", "corrupt_image"),
            jpeg[: len(jpeg) // 2],
        ),
        (
            Kind("webp_truncated", "cut.webp", "rejected", "corrupt_image"),
            webp[: len(webp) // 2],
        ),
        (
            Kind("gif_garbage", "bad.gif", "rejected", "corrupt_image"),
            b"GIF89a" + bytes(range(7, 250)) * 4,
        ),
        (
            Kind("png_pixel_bomb", "bomb.png", "rejected", "too_many_pixels"),
            png_pixel_bomb(),
        ),
        (
            Kind("pdf_huge_page", "poster.pdf", "rejected", "too_many_pixels"),
            pdf_bytes(pages=1, size=(14400.0, 14400.0)),
        ),
        (
            Kind("pdf_over_page_limit", "long.pdf", "rejected", "too_many_pages"),
            pdf_bytes(pages=21, size=(100.0, 100.0)),
        ),
        (
            Kind("over_byte_limit", "big.png", "rejected", "too_large"),
            good_png + os.urandom(8 * 1024 * 1024),
        ),
        (
            Kind("tiff_third_frame_truncated", "memo-cut.tif", "rejected", "corrupt_image"),
            tiff_truncated_third_frame(),
        ),
        (
            Kind("pdf_xobjects_8_deep", "xobjects.pdf", "rejected", "render_budget"),
            pdf_xobject_bomb(8),
        ),
        (
            Kind("pdf_inflates_to_1_gib", "inflate.pdf", "rejected", "render_budget"),
            pdf_inflate_bomb(1024),
        ),
        (Kind("file_removed_mid_run", VANISHED, "rejected", "not_found"), good_png),
        (
            Kind("strip_20000x10", "strip-20000x10.png", "done"),
            strip(20000, 10, 0),
        ),
        (
            Kind("strip_20000x60", "strip-20000x60.png", "done"),
            strip(20000, 60, 40),
        ),
        (Kind("strip_10x20000", "strip-10x20000.png", "done"), strip(10, 20000, 0)),
        (
            Kind("large_page_small_text", "large-7700.png", "done", text=LARGE_LINE),
            large_page_small_text(),
        ),
        (
            Kind("non_utf8_name", os.fsdecode(NON_UTF8_NAME), "done", text="Invoice 4711"),
            _save(_text_image(["Invoice 4711 under an odd name"]), "PNG"),
        ),
        (
            Kind("odd_name", "re port\t(é) 'x'.png", "done", text="odd name"),
            _save(_text_image(["A file with an odd name"]), "PNG"),
        ),
        (
            Kind("pdf_rotate_90", "rotate90.pdf", "done", text="Shipment"),
            pdf_rotated(90, "Shipment 2231 left the depot"),
        ),
        (
            Kind("pdf_rotate_270", "rotate270.pdf", "done", text="Shipment"),
            pdf_rotated(270, "Shipment 7789 arrived late"),
        ),
        (
            Kind("scan_upside_down", "upside-down.png", "done", text="Invoice 4711"),
            _save(good.transpose(Image.Transpose.ROTATE_180), "PNG"),
        ),
        (
            Kind("scan_sideways", "sideways.png", "done", text="Invoice 4711"),
            _save(good.transpose(Image.Transpose.ROTATE_90), "PNG"),
        ),
        (Kind("jpeg_exif_orientation_6", "exif6.jpg", "done", text="Invoice 4711"), sideways),
        (Kind("one_pixel", "dot.png", "done"), _save(Image.new("RGB", (1, 1)), "PNG")),
        (Kind("blank_page", "blank.png", "done"), _save(Image.new("L", (600, 800), 255), "PNG")),
        (Kind("png_16bit_gray", "gray16.png", "done", text="Invoice 4711"), _save(wide16, "PNG")),
        (
            Kind("jpeg_cmyk", "cmyk.jpg", "done", text="Invoice 4711"),
            _save(good.convert("CMYK"), "JPEG"),
        ),
        (
            Kind("png_palette_transparent", "palette.png", "done", text="Invoice 4711"),
            _save(palette, "PNG"),
        ),
        (
            Kind("gif_two_frames", "anim.gif", "done", text="Animated frame"),
            _save(gif_frames[0], "GIF", save_all=True, append_images=gif_frames[1:]),
        ),
        (
            Kind("tiff_three_frames", "memo.tif", "done", text="Memo page"),
            _save(tiff_frames[0], "TIFF", save_all=True, append_images=tiff_frames[1:]),
        ),
        (Kind("webp", "photo.webp", "done", text="Invoice 4711"), webp),
        (Kind("bmp", "scan.bmp", "done", text="Invoice 4711"), _save(good, "BMP")),
        (Kind("png_with_pdf_text_chunk", "polyglot.png", "done", text="Invoice"), polyglot),
        (
            Kind("pdf_junk_before_header", "junk-head.pdf", "done", text="Page 1"),
            b"JUNK" * 16 + pdf_bytes(pages=1, size=(300.0, 120.0)),
        ),
        (
            Kind("pdf_named_png", "really-a-pdf.png", "done", text="Page 1"),
            pdf_bytes(pages=1, size=(320.0, 100.0)),
        ),
        (
            Kind("pdf_lying_page_count", "lying.pdf", "rejected", "corrupt_pdf"),
            pdf_lying_count(),
        ),
    ]


def _pnginfo(text: str) -> object:
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", text)
    return info


def _zip_bytes() -> bytes:
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("report.pdf", pdf_bytes(pages=1))
    return out.getvalue()


def build(folder: Path) -> list[Kind]:
    """Write the corpus into `folder`; returns every kind, the skipped ones included."""
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    for kind, data in kinds():
        (folder / kind.filename).write_bytes(data)
        made.append(kind)
    (folder / "notes.txt").write_text("not an input\n")
    made.append(Kind("text_file_in_folder", "notes.txt", "skipped", "unsupported type"))
    (folder / "link.png").symlink_to(folder / "blank.png")
    made.append(Kind("symlink_to_file", "link.png", "skipped", "link"))
    (folder / "loop").symlink_to(folder, target_is_directory=True)
    made.append(Kind("symlink_loop", "loop", "skipped", "link to a folder"))
    os.mkfifo(folder / "pipe.png")
    made.append(Kind("fifo", "pipe.png", "skipped", "not a regular file"))
    return made


def vanish_when_listed(folder: Path, db_path: Path, timeout: float = 600) -> bool:
    """Delete `VANISHED` as soon as the run has made its first document row (it has listed
    the folder by then, and reads inputs in name order, this one last)."""
    import sqlite3

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db_path.exists():
            try:
                with sqlite3.connect(db_path) as conn:
                    if conn.execute("SELECT count(*) FROM documents").fetchone()[0] > 0:
                        (folder / VANISHED).unlink()
                        return True
            except sqlite3.OperationalError:
                pass  # not migrated yet, or locked
        time.sleep(0.05)
    return False


def run_corpus(folder: Path, workdir: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`ocrfleet run --json folder` in `workdir`, deleting `VANISHED` mid-run."""
    import threading

    db_path = workdir / "ocrfleet.db"
    env = {
        **os.environ,
        "OCRFLEET_DATABASE_URL": f"sqlite:///{db_path}",
        "OCRFLEET_STORE_URL": f"file://{workdir / 'store'}",
        "OCRFLEET_CACHE_DIR": str(workdir / "cache"),
        "OMP_THREAD_LIMIT": "1",
        "PYTHONPATH": str(REPO),
        **SETTINGS,
    }
    vanisher = threading.Thread(target=vanish_when_listed, args=(folder, db_path), daemon=True)
    vanisher.start()
    done = subprocess.run(
        [sys.executable, "-m", "ocrfleet.cli", "run", "--json", str(folder)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return done, db_path


def table(made: list[Kind], rows: list[dict]) -> list[tuple[str, str, str]]:
    """(kind, state, reason) per kind, from `ocrfleet run --json` rows and the skips."""
    by_name = {Path(row["input"]).name: row for row in rows}
    out = []
    for kind in made:
        if kind.state == "skipped":
            out.append((kind.name, "skipped", kind.reason))
            continue
        shown = kind.filename.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        row = by_name.get(shown)
        if row is None:
            out.append((kind.name, "missing", ""))
        else:
            out.append((kind.name, row["status"], "; ".join(row["reasons"])))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="build and run in this folder, and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        made = build(root / "inputs")
        started = time.monotonic()
        done, _ = run_corpus(root / "inputs", root)
        elapsed = time.monotonic() - started
        rows = json.loads(done.stdout)
        width = max(len(kind.name) for kind in made)
        for name, state, reason in table(made, rows):
            print(f"{name:<{width}}  {state:<8}  {reason[:110]}")
        inputs = sum(1 for kind in made if kind.state != "skipped")
        print(f"{len(made)} kinds ({inputs} inputs), exit {done.returncode}, {elapsed:.0f} s")
        print(f"console lines with 'Traceback': {done.stderr.count('Traceback')}")


if __name__ == "__main__":
    main()
