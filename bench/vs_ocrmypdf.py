"""Searchable PDFs from scans: `ocrfleet run -o DIR` (which writes them) against OCRmyPDF
(Debian tesseract, `OMP_THREAD_LIMIT=1`) on the same pages and cores.

Sets, each made into one multi-page PDF that both systems get:
- `tesseract_test`: every realdocs/tesseract_test page (two UNLV scans, eurotext,
  phototest); truth: the page `.txt`;
- `olmocr`: every page of the olmOCR-bench sample PDFs; truth: the text of each page's
  `present` checks (12 of its 23 pages have some; the others are timed only);
- `receipts`: `--receipts N` SROIE receipts (training data beside realdocs); truth: the
  transcript lines of box/<id>.csv.

With `--text-layers ocr` (the default) both systems OCR every page: OCRmyPDF `--force-ocr`,
ocrfleet `OCRFLEET_TEXT_LAYER=redo`; with `use`, a PDF page with a good text layer is read from
it: OCRmyPDF `--skip-text`, ocrfleet's default. OCRmyPDF runs with `--output-type pdf
--optimize 0` (no PDF/A conversion, no image optimisation: the least work it can do for a
searchable PDF), `ocrfleet run` with its default settings otherwise (layout, orientation,
RapidOCR, the verifier, SQLite) on a fresh database and store per run. Each arm
runs at `--jobs 1` and `--jobs 2`, the arms interleaved and their order rotated every round,
for `--rounds` (at least 3) rounds, so a slow spell on a shared machine hits every arm.
`--baseline DIR` adds the ocrfleet of another checkout (`git worktree add DIR REV`), run with
the same interpreter; a checkout without `run --jobs` runs at one job only.

Word recall: `pdftotext` of each output PDF's page against that page's truth, words as
multisets (`bench.corpus.word_recall`), summed per set. Peak RSS: the sum over the arm's
process tree (workers included), sampled every 0.2 s.

    python bench/vs_ocrmypdf.py [--limit N] [--receipts 8] [--rounds 3] [--jobs 1,2]
                                [--text-layers ocr|use] [--baseline /tmp/base]

`--limit N` keeps the first N pages of each set (a quick run); all pages by default. Prints
each round, then per jobs: pages/min of each arm, `ocrfleet/ocrmypdf: X.XX` (median over
rounds of the paired ratio of pages/min), peak RSS, and word recall per set.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import img2pdf
import numpy as np
import pikepdf
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.corpus import (  # noqa: E402
    OLMOCR,
    REALDOCS,
    olmocr_truth,
    receipt_images,
    receipt_truth,
    word_recall,
)
from ocrfleet.memory import PeakRss  # noqa: E402

BIN = Path(sys.executable).parent


@dataclass
class Corpus:
    """One set as a single PDF and the truth of each of its pages (None: timed only)."""

    name: str
    pdf: Path
    truth: list[str | None]


@dataclass
class Arm:
    name: str
    run: Callable[[list[Corpus], Path, int], dict[str, Path]]  # -> output PDF per set
    jobs: tuple[int, ...]
    seconds: dict[int, list[float]] = field(default_factory=dict)
    peak_mb: dict[int, float] = field(default_factory=dict)
    outputs: dict[int, dict[str, Path]] = field(default_factory=dict)


def build_sets(root: Path, limit: int | None, receipts: int) -> list[Corpus]:
    sets = []
    scans = sorted((REALDOCS / "tesseract_test").glob("*.tif"))[:limit]
    sets.append(
        _images(root, "tesseract_test", scans, [p.with_suffix(".txt").read_text() for p in scans])
    )
    truths = olmocr_truth()
    merged, truth = pikepdf.new(), []
    for path in sorted((OLMOCR / "pdfs").rglob("*.pdf")):
        with pikepdf.open(path) as src:
            for number, page in enumerate(src.pages, start=1):
                if limit is None or len(truth) < limit:
                    merged.pages.append(page)
                    truth.append(truths.get((str(path.relative_to(OLMOCR / "pdfs")), number)))
    merged.save(root / "olmocr.pdf")
    sets.append(Corpus("olmocr", root / "olmocr.pdf", truth))
    images = receipt_images(receipts)[:limit]
    sets.append(_images(root, "receipts", images, [receipt_truth(p) for p in images]))
    return sets


def _images(root: Path, name: str, images: list[Path], truth: list[str]) -> Corpus:
    """Scans as one PDF, each at its own resolution (300 dpi where the file names none)."""
    pdf = root / f"{name}.pdf"
    layout = img2pdf.get_fixed_dpi_layout_fun((300, 300))
    with_dpi = []
    for image in images:
        with Image.open(image) as opened:
            with_dpi.append("dpi" in opened.info)
    if all(with_dpi):
        pdf.write_bytes(img2pdf.convert([str(p) for p in images]))
    else:
        pdf.write_bytes(img2pdf.convert([str(p) for p in images], layout_fun=layout))
    return Corpus(name, pdf, list(truth))


def ocrmypdf(text_layers: str) -> Callable[..., dict]:
    """An arm running OCRmyPDF on each set's PDF."""
    layers = "--force-ocr" if text_layers == "ocr" else "--skip-text"

    def run(sets: list[Corpus], workdir: Path, jobs: int) -> dict[str, Path]:
        env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
        out = {}
        for corpus in sets:
            out[corpus.name] = workdir / f"{corpus.name}.pdf"
            cmd = [str(BIN / "ocrmypdf"), "--jobs", str(jobs), layers, "--output-type", "pdf"]
            cmd += ["--optimize", "0", "-q", str(corpus.pdf), str(out[corpus.name])]
            subprocess.run(cmd, env=env, check=True, capture_output=True)
        return out

    return run


def ocrfleet(
    checkout: Path | None, cache: Path, options: set[str], text_layers: str
) -> Callable[..., dict]:
    """An arm running `ocrfleet run -o DIR` (its PDFs written by the run), from this checkout
    or `checkout` (put first on PYTHONPATH); a checkout without `run -o` runs `ocrfleet
    results --format pdf` per set after the run, and one without `run --jobs`, one job."""

    def run(sets: list[Corpus], workdir: Path, jobs: int) -> dict[str, Path]:
        env = {
            **os.environ,
            "OCRFLEET_DATABASE_URL": f"sqlite:///{workdir / 'ocrfleet.db'}",
            "OCRFLEET_STORE_URL": f"file://{workdir / 'store'}",
            "OCRFLEET_CACHE_DIR": str(cache),
            "OCRFLEET_TEXT_LAYER": "redo" if text_layers == "ocr" else "use",
        }
        if checkout is not None:
            env["PYTHONPATH"] = str(checkout)
        cmd = [str(BIN / "ocrfleet"), "run"]
        cmd += ["--jobs", str(jobs)] if "--jobs" in options else []
        written = "--output-dir" in options
        cmd += ["--output-dir", str(workdir / "out")] if written else []
        done = subprocess.run(
            [*cmd, *(str(c.pdf) for c in sets)], env=env, cwd=workdir, capture_output=True
        )
        if done.returncode not in (0, 1):
            raise SystemExit(f"ocrfleet run exited {done.returncode}: {done.stderr[-2000:]!r}")
        if written:
            return {corpus.name: workdir / "out" / corpus.pdf.name for corpus in sets}
        out = {}
        for corpus in sets:
            out[corpus.name] = workdir / f"{corpus.name}.out.pdf"
            done = subprocess.run(
                [str(BIN / "ocrfleet"), "results", "--format", "pdf", "-o", str(out[corpus.name])]
                + [str(corpus.pdf)],
                env=env,
                cwd=workdir,
                capture_output=True,
            )
            if done.returncode != 0:
                raise SystemExit(
                    f"ocrfleet results exited {done.returncode}: {done.stderr[-2000:]!r}"
                )
        return out

    return run


def _run_options(checkout: Path | None) -> set[str]:
    """Which of `run`'s options the checkout's ocrfleet has."""
    env = {**os.environ, **({"PYTHONPATH": str(checkout)} if checkout else {})}
    done = subprocess.run([str(BIN / "ocrfleet"), "run", "--help"], env=env, capture_output=True)
    return {option for option in ("--jobs", "--output-dir") if option.encode() in done.stdout}


def page_texts(pdf: Path, pages: int) -> list[str]:
    text = subprocess.run(
        ["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True
    ).stdout
    parts = text.split("\f")
    return (parts + [""] * pages)[:pages]


def recall(arm_outputs: dict[str, Path], sets: list[Corpus]) -> dict[str, tuple[int, int]]:
    found = {}
    for corpus in sets:
        texts = page_texts(arm_outputs[corpus.name], len(corpus.truth))
        hit = total = 0
        for text, truth in zip(texts, corpus.truth, strict=True):
            if truth is not None:
                h, t = word_recall(text, truth)
                hit, total = hit + h, total + t
        found[corpus.name] = (hit, total)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="first N pages of each set")
    parser.add_argument("--receipts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", default="1,2")
    parser.add_argument("--text-layers", choices=("ocr", "use"), default="ocr")
    parser.add_argument("--baseline", type=Path, default=None, help="another ocrfleet checkout")
    args = parser.parse_args()
    rounds = max(3, args.rounds)
    jobs = tuple(int(j) for j in args.jobs.split(","))
    with tempfile.TemporaryDirectory(prefix="vs-ocrmypdf-") as tmp:
        root = Path(tmp)
        sets = build_sets(root, args.limit, args.receipts)
        pages = sum(len(c.truth) for c in sets)
        arms = [
            Arm("ocrmypdf", ocrmypdf(args.text_layers), jobs),
            Arm(
                "ocrfleet",
                ocrfleet(None, root / "cache", _run_options(None), args.text_layers),
                jobs,
            ),
        ]
        if args.baseline is not None:
            options = _run_options(args.baseline)
            arms.append(
                Arm(
                    "baseline",
                    ocrfleet(args.baseline, root / "cache-base", options, args.text_layers),
                    jobs if "--jobs" in options else (1,),
                )
            )
        print(
            f"sets: {', '.join(f'{c.name} {len(c.truth)} pages' for c in sets)}; "
            f"rounds: {rounds}; jobs: {jobs}; cpus: {len(os.sched_getaffinity(0))}"
        )
        warm = pikepdf.new()
        with pikepdf.open(sets[0].pdf) as first:
            warm.pages.append(first.pages[0])
        warm.save(root / "warm.pdf")
        warm = [Corpus("warm", root / "warm.pdf", sets[0].truth[:1])]
        for arm in arms:  # models and caches warm, not timed
            arm.run(warm, _fresh(root / f"warm-{arm.name}"), 1)
        for number in range(rounds):
            for n in jobs:
                order = [a for a in arms if n in a.jobs]
                order = order[number % len(order) :] + order[: number % len(order)]
                line = []
                for arm in order:
                    workdir = _fresh(root / f"{arm.name}-{n}-{number}")
                    with PeakRss(descendants_only=True) as rss:
                        started = time.perf_counter()
                        outputs = arm.run(sets, workdir, n)
                        seconds = time.perf_counter() - started
                    arm.seconds.setdefault(n, []).append(seconds)
                    arm.peak_mb[n] = max(arm.peak_mb.get(n, 0.0), rss.peak_mb)
                    if n not in arm.outputs:
                        kept = _fresh(root / f"out-{arm.name}-{n}")
                        arm.outputs[n] = {k: Path(shutil.copy(v, kept)) for k, v in outputs.items()}
                    line.append(
                        f"{arm.name} {60 * pages / seconds:.1f} pages/min ({seconds:.1f} s)"
                    )
                print(f"round {number + 1}, jobs {n}: " + ", ".join(line), flush=True)
        print()
        for n in jobs:
            print(f"--jobs {n} ({pages} pages):")
            for arm in arms:
                if n not in arm.jobs:
                    continue
                ppm = 60 * pages / float(np.median(arm.seconds[n]))
                scores = recall(arm.outputs[n], sets)
                parts = ", ".join(
                    f"{k} {h / max(1, t):.3f} ({h}/{t})" for k, (h, t) in scores.items()
                )
                print(
                    f"  {arm.name}: {ppm:.1f} pages/min, peak RSS {arm.peak_mb[n]:.0f} MB; "
                    f"word recall {parts}"
                )
            theirs = arms[0].seconds[n]
            for arm in arms[1:]:
                if n in arm.jobs:
                    ratio = float(
                        np.median([t / s for t, s in zip(theirs, arm.seconds[n], strict=True)])
                    )
                    print(f"  {arm.name}/ocrmypdf: {ratio:.2f}")
            if "baseline" in {a.name for a in arms} and n in arms[2].jobs:
                ratio = float(
                    np.median(
                        [b / s for b, s in zip(arms[2].seconds[n], arms[1].seconds[n], strict=True)]
                    )
                )
                print(f"  ocrfleet/baseline: {ratio:.2f}")


def _fresh(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


if __name__ == "__main__":
    main()
