"""Tesseract as a line recogniser (`--psm 7`): a batch is split over a few tesseract
processes, one per CPU of the thread budget, each reading its share from a list file.

The binary is run directly rather than through pytesseract for two reasons: pytesseract
hands its subprocess the process-wide `os.environ`, so `OMP_THREAD_LIMIT=1` (tesseract's
OpenMP otherwise oversubscribes shared cores) could only be set for the whole worker,
where it would also throttle torch's OpenMP; and tesseract reads a whole batch from a list
file in one process, which saves loading the language model once per crop. One process
reads on one core: with `OMP_THREAD_LIMIT=1` a single process left every other core of the
budget idle while the page waited for its re-reads. Each crop is read on its own (`--psm
7`, the LSTM engine keeps no state between images), so the split changes no reading.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PIL import Image

from ocrfleet import ir
from ocrfleet.engines.calls import available_cpus

PSM_SINGLE_LINE = 7
_TIMEOUT_BASE_S = 60
_TIMEOUT_PER_CROP_S = 10
# A process costs about 0.1 s to start (loading the model): fewer crops than this per
# process are not worth another one.
_MIN_CROPS_PER_PROCESS = 4


def _run(
    binary: str, args: list[str], timeout: int = _TIMEOUT_BASE_S
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [binary, *args],
        env={**os.environ, "OMP_THREAD_LIMIT": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"tesseract {args[0]} exited {done.returncode}: {done.stderr.strip()[-500:]}"
        )
    return done


def _probe(cmd: str, lang: str) -> tuple[str, str]:
    """(binary path, version) after checking the binary and every language exist.

    version = `<tesseract version>+<hash of that version line, psm, lang and the sha256 of
    each traineddata file>`: it enters run_id."""
    binary = shutil.which(cmd)
    if binary is None:
        raise FileNotFoundError(
            f"tesseract binary {cmd!r} not found on PATH; install it "
            "(Debian: apt-get install tesseract-ocr tesseract-ocr-eng)"
        )
    listing = _run(binary, ["--list-langs"]).stdout
    found = re.search(r'"(.+?)"', listing)
    if found is None:
        raise RuntimeError(f"cannot read tesseract's tessdata folder from {listing[:200]!r}")
    tessdata = Path(found.group(1))
    installed = {line.strip() for line in listing.splitlines()[1:] if line.strip()}
    wanted = [part for part in lang.split("+") if part]
    missing = [part for part in wanted if part not in installed]
    if not wanted or missing:
        raise ValueError(
            f"tesseract language {lang!r}: {missing or 'no language'} not installed in "
            f"{tessdata} (installed: {sorted(installed)}); install the matching "
            "tesseract-ocr-<lang> package or set OCRFLEET_TESSERACT_LANG"
        )
    version_line = _run(binary, ["--version"]).stdout.splitlines()[0].strip()
    digest = hashlib.sha256(f"{version_line};psm={PSM_SINGLE_LINE};lang={lang}".encode())
    for part in wanted:
        digest.update(_file_sha256(tessdata / f"{part}.traineddata").encode())
    return binary, f"{version_line.split()[-1]}+{digest.hexdigest()[:12]}"


def tesseract_version(lang: str = "eng", cmd: str = "tesseract") -> str:
    """The recogniser's version without constructing it (for run_id)."""
    return _probe(cmd, lang)[1]


class TesseractRecogniser:
    """Reads each crop as one text line; confidence = mean word confidence / 100, None when
    tesseract finds no word. A batch runs on up to `processes` tesseract processes at once
    (default: the CPUs this process may use)."""

    name = "tesseract"

    def __init__(self, lang: str = "eng", cmd: str = "tesseract", processes: int | None = None):
        self._binary, self.version = _probe(cmd, lang)
        self.lang = lang
        self.processes = max(1, processes or available_cpus())

    def recognise(self, crops: list[Image.Image]) -> list[tuple[str, float | None]]:
        return [(text, confidence) for text, confidence, _ in self.recognise_words(crops)]

    def recognise_words(
        self, crops: list[Image.Image]
    ) -> list[tuple[str, float | None, list[ir.Word]]]:
        if not crops:
            return []
        for crop in crops:
            if crop.width == 0 or crop.height == 0:
                raise ValueError(f"empty image {crop.width}x{crop.height}: nothing to read")
        shares = _shares([crop.width * crop.height for crop in crops], self.processes)
        with tempfile.TemporaryDirectory(prefix="ocrfleet-tess-") as tmp:
            folder = Path(tmp)
            for index, crop in enumerate(crops):
                crop.convert("RGB").save(folder / f"{index:05d}.png", compress_level=1)
            if len(shares) == 1:
                tsvs = [self._read_share(folder, 0, shares[0])]
            else:
                with ThreadPoolExecutor(len(shares)) as pool:
                    tsvs = list(
                        pool.map(
                            self._read_share, [folder] * len(shares), range(len(shares)), shares
                        )
                    )
        results: list[tuple[str, float | None, list[ir.Word]] | None] = [None] * len(crops)
        for share, tsv in zip(shares, tsvs, strict=True):
            for index, result in zip(share, _parse_tsv(tsv, len(share)), strict=True):
                results[index] = result
        return results  # type: ignore[return-value]

    def _read_share(self, folder: Path, number: int, share: list[int]) -> str:
        """One tesseract process reading the crops `share` (indices) of the batch."""
        listing = folder / f"crops{number}.txt"  # not an image: tesseract reads it as a list
        listing.write_text("".join(f"{folder / f'{index:05d}.png'}\n" for index in share))
        _run(
            self._binary,
            [str(listing), str(folder / f"out{number}"), "--psm", str(PSM_SINGLE_LINE)]
            + ["-l", self.lang, "tsv"],
            timeout=_TIMEOUT_BASE_S + _TIMEOUT_PER_CROP_S * len(share),
        )
        return (folder / f"out{number}.tsv").read_text(encoding="utf-8")


def _shares(costs: list[int], processes: int) -> list[list[int]]:
    """The batch's indices split over at most `processes` processes (at least
    _MIN_CROPS_PER_PROCESS crops each), costliest crop first to the least loaded, each
    share in batch order."""
    count = max(1, min(processes, len(costs) // _MIN_CROPS_PER_PROCESS))
    shares: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for index in sorted(range(len(costs)), key=lambda i: -costs[i]):
        least = loads.index(min(loads))
        shares[least].append(index)
        loads[least] += costs[index]
    return [sorted(share) for share in shares]


def _parse_tsv(tsv: str, count: int) -> list[tuple[str, float | None, list[ir.Word]]]:
    """Words of each listed image (TSV `page_num`, 1-based), joined by spaces per line, and
    each word's box (TSV left, top, width, height) and confidence."""
    lines: list[dict[tuple[int, int, int], list[str]]] = [{} for _ in range(count)]
    boxes: list[dict[tuple[int, int, int], list[ir.Word]]] = [{} for _ in range(count)]
    confs: list[list[float]] = [[] for _ in range(count)]
    rows = tsv.splitlines()
    header = rows[0].split("\t") if rows else []
    col = {name: i for i, name in enumerate(header)}
    for row in rows[1:]:
        cells = row.split("\t")
        if len(cells) < len(header) or cells[col["level"]] != "5":
            continue
        text, conf = cells[col["text"]].strip(), float(cells[col["conf"]])
        if not text or conf < 0:
            continue
        page = int(cells[col["page_num"]]) - 1
        if not 0 <= page < count:
            raise RuntimeError(f"tesseract reported page {page + 1} for {count} crops")
        key = (
            int(cells[col["block_num"]]),
            int(cells[col["par_num"]]),
            int(cells[col["line_num"]]),
        )
        lines[page].setdefault(key, []).append(text)
        confs[page].append(conf)
        left, top = int(cells[col["left"]]), int(cells[col["top"]])
        box = ir.BBox(
            x0=max(left, 0),
            y0=max(top, 0),
            x1=max(left + int(cells[col["width"]]), left, 0),
            y1=max(top + int(cells[col["height"]]), top, 0),
        )
        word = ir.Word(text=text, bbox=box, confidence=min(max(conf / 100, 0.0), 1.0))
        boxes[page].setdefault(key, []).append(word)
    results: list[tuple[str, float | None, list[ir.Word]]] = []
    for page_lines, page_boxes, page_confs in zip(lines, boxes, confs, strict=True):
        text = "\n".join(" ".join(words) for _, words in sorted(page_lines.items()))
        confidence = sum(page_confs) / len(page_confs) / 100 if page_confs else None
        words = [
            word.model_copy(update={"line": number})
            for number, (_, line) in enumerate(sorted(page_boxes.items()))
            for word in line
        ]
        confidence = None if confidence is None else min(max(confidence, 0.0), 1.0)
        results.append((text, confidence, words))
    return results


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
