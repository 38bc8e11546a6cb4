"""Real labelled regions, read by every engine, cached: the consensus scorer's training and
validation rows. `python bench/realrows.py [--sets sroie,uw3,unlv]` fills the cache.

Rows are built the way production sees them:

- sroie (train/sroie, 149 receipts): the project's detector runs on the whole receipt,
  with the default layout (`LAYOUT`, pinned here: a new default must not change the
  training rows unnoticed); each detected region takes the ground-truth line whose box
  overlaps it most (IoU >= 0.5, each covering >= 90% of the other's width, each
  ground-truth line used once), source `det`. Its truth is what the crop shows
  (`visible_truth`): punctuation the annotation places beyond the detected region (a " :"
  printed apart from its words) is not part of it. The ground-truth boxes'
  own crops (of every third receipt, to bound the engine time) are a second source, `gt`.
  SROIE transcripts are often upper-cased where the print is not, so its labels compare
  case-insensitively (`case_sensitive` False).
- uw3 (realdocs/uw3_500_ocropy/book, 500 lines from 410 pages): the upstream line images,
  source `gt`; the page folder is the document.
- unlv (realdocs/tesseract_test, 2 pages): the detector's lines inside each zone, matched
  to the page's ground-truth lines by text (bench/reallines.py), source `det`.
- pdf (Debian's PDF manuals under /usr/share/doc, `DEBIAN_MANUALS`: born-digital pages from
  other typesetters than the olmOCR sample's, which stays out of training as its check):
  `PDF_PAGES` pages of each, spread through it, through the split as production takes them;
  each line of a text layer that `textlayer.judge` finds good is a row, source `layer`, its
  truth the layer's text (what a searchable PDF is judged against). These rows are where
  the `pdf-text` candidates' evidence is learnt: the crops are renders, not scans, and the
  readers' doubts on them (superscripts, wide gaps, a `:` for a `.`) are their own.

Every crop is read by RapidOCR and tesseract once (text, line confidence, least word
confidence); the readings are cached per set in
`bench/out/realrows/<set>.jsonl` (gitignored) under the engines' versions, so a refit costs
no engine time. A document already in the cache with the same versions is not read again.

A second pass (`--ctc`) adds what the CTC models say about each crop, cached in
`bench/out/realrows/<set>.ctc.jsonl` by the crop (image and box), never re-reading
tesseract: EasyOCR's reading (the third reader, as a candidate engine: the reading primes
the posterior cache, `ocrfleet.scorers.ctc.RECENT`, so it costs one model call), and per CTC model
(RapidOCR's, EasyOCR's) its greedy reading, its character evidence and the log-likelihood
of every text the training asks about (each engine's reading, the truth and its
augmentations). A text the cache lacks (a corrected label) is scored by running only the
CTC models on that crop again.

Labels are the annotation's text as audited: each cached row records its ground-truth
line's identity in the annotation (`line`) and the annotation's text, and `load_rows`
applies `bench/label_audit.py`'s corrections, so a correction changes labels without any
engine reading again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.corpus import REALDOCS, SROIE, receipt_lines  # noqa: E402
from ocrfleet import ir  # noqa: E402
from ocrfleet.engines.base import Recogniser  # noqa: E402
from ocrfleet.pipeline.images import load_image  # noqa: E402
from ocrfleet.pipeline.regions import crop, detect_regions  # noqa: E402
from ocrfleet.scorers.consensus import read_with_words  # noqa: E402

UW3_BOOK = REALDOCS / "uw3_500_ocropy" / "book"
OUT = ROOT / "bench" / "out" / "realrows"
LAYOUT = "rapid"  # the detector's layout setting the rows are detected with
SETS = ("sroie", "uw3", "unlv", "pdf")
# Debian packages' manuals (bzip2-doc, fontconfig, libtasn1-doc, nettle-dev, shared-mime-info,
# valgrind); a machine without one has fewer rows, and says so.
DEBIAN_MANUALS = (
    "/usr/share/doc/bzip2/manual.pdf.gz",
    "/usr/share/doc/fontconfig/fontconfig-user.pdf.gz",
    "/usr/share/doc/libtasn1-doc/libtasn1.pdf",
    "/usr/share/doc/nettle-dev/nettle.pdf.gz",
    "/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf",
    "/usr/share/doc/valgrind/valgrind_manual.pdf.gz",
)
PDF_PAGES = 4  # pages of each manual
# The readers of the first pass; the other readers (EasyOCR) read in the CTC pass, where
# their reading and their posterior come from one model call.
FIRST_PASS = ("rapidocr", "tesseract")
# Rows the CTC pass reads: a receipt's ground-truth box crops (source `gt`) are left out (a
# third of the receipt rows; they are the production-like detected regions' partners, whose
# first-pass readings augment training, not candidates of their own).
CTC_SOURCES = {"sroie": ("det",), "uw3": ("gt",), "unlv": ("det",), "pdf": ("layer",)}
MIN_IOU = 0.5
MIN_COVER = 0.9
GT_EVERY = 3  # ground-truth box crops of every third receipt: the second source, not the base


@dataclass(frozen=True)
class RealRow:
    """One labelled crop and every engine's reading of it."""

    set: str
    doc: str  # the grouping unit: receipt, page
    id: str
    source: str  # "det" (detected region) or "gt" (ground-truth box / line image)
    image: str  # path of the page or line image
    bbox: tuple[int, int, int, int] | None  # on `image`; None: the whole image
    truth: str  # the annotation's text as audited (bench/label_audit.py)
    case_sensitive: bool
    # engine -> (text, confidence, least word confidence), None if the read failed
    reads: dict[str, Reading | None]
    line: str = ""  # the ground-truth line's identity in its annotation
    # CTC model -> what it says about the crop (the `--ctc` pass); empty before that pass
    ctc: dict[str, CtcRecord] = field(default_factory=dict)
    # engine -> the version that read it or gave its CTC evidence (the cache's `name@version`
    # keys): the weights record which readers they were fitted on
    versions: dict[str, str] = field(default_factory=dict)

    def crop(self) -> Image.Image:
        page = _image(self.image)
        if self.bbox is None:
            return page
        x0, y0, x1, y1 = self.bbox
        return crop(page, ir.BBox(x0=x0, y0=y0, x1=x1, y1=y1))


@lru_cache(maxsize=4)
def _image(path: str) -> Image.Image:
    return load_image(Path(path).read_bytes())


def iou(a: Sequence[int], b: Sequence[int]) -> float:
    ix = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def same_line(d: Sequence[int], t: Sequence[int], min_cover: float = MIN_COVER) -> bool:
    """The two boxes span the same stretch of one line: each covers most of the other's
    width, and they overlap by most of the smaller height. A detected region that holds
    only part of a ground-truth line has no truth of its own, so it is not matched."""
    ix = min(d[2], t[2]) - max(d[0], t[0])
    iy = min(d[3], t[3]) - max(d[1], t[1])
    if ix <= 0 or iy <= 0:
        return False
    return (
        ix >= min_cover * (d[2] - d[0])
        and ix >= min_cover * (t[2] - t[0])
        and iy >= 0.5 * min(d[3] - d[1], t[3] - t[1])
    )


def match_by_overlap(
    detected: Sequence[Sequence[int]], truth: Sequence[Sequence[int]], min_iou: float = MIN_IOU
) -> dict[int, int]:
    """detected index -> truth index, greedily by IoU among pairs on the same line
    (`same_line`), each side used once."""
    pairs = sorted(
        (
            (iou(d, t), i, j)
            for i, d in enumerate(detected)
            for j, t in enumerate(truth)
            if iou(d, t) >= min_iou and same_line(d, t)
        ),
        reverse=True,
    )
    used_d: set[int] = set()
    used_t: set[int] = set()
    out = {}
    for _, i, j in pairs:
        if i not in used_d and j not in used_t:
            out[i] = j
            used_d.add(i)
            used_t.add(j)
    return out


# ---- the sets ---------------------------------------------------------------------------


def sroie_docs(detector, shard: tuple[int, int] = (0, 1)) -> Iterator[tuple[str, list[RealRow]]]:
    for n, csv in enumerate(sorted((SROIE / "box").glob("*.csv"))):
        if n % shard[1] != shard[0]:
            continue
        receipt = csv.stem
        path = str(SROIE / "images" / f"{receipt}.jpg")
        page = _image(path)
        truth = []
        for box, text, line in receipt_lines(receipt):
            x0, y0 = max(0, box[0]), max(0, box[1])
            x1, y1 = min(page.width, box[2]), min(page.height, box[3])
            if x1 > x0 and y1 > y0:
                truth.append(((x0, y0, x1, y1), text, str(line)))
        regions = detect_regions(page, detector)
        detected = [r.bbox.as_tuple() for r in regions]
        matched = match_by_overlap(detected, [box for box, _, _ in truth])
        rows = []
        for i, j in sorted(matched.items()):
            rows.append(
                RealRow("sroie", receipt, f"{receipt}/det{i}", "det", path, detected[i],
                        truth[j][1], False, {}, truth[j][2])
            )  # fmt: skip
        for j, (box, text, line) in enumerate(truth if n % GT_EVERY == 0 else []):
            rows.append(
                RealRow("sroie", receipt, f"{receipt}/gt{j}", "gt", path, box, text, False, {},
                        line)
            )  # fmt: skip
        yield receipt, rows


def uw3_docs() -> Iterator[tuple[str, list[RealRow]]]:
    for folder in sorted(p for p in UW3_BOOK.iterdir() if p.is_dir()):
        rows = []
        for png in sorted(folder.glob("*.bin.png")):
            gt = png.with_name(png.name.replace(".bin.png", ".gt.txt"))
            if not gt.is_file():
                continue
            truth = gt.read_text(encoding="utf-8").strip()
            stem = png.name.split(".")[0]
            rows.append(
                RealRow("uw3", folder.name, f"{folder.name}/{stem}", "gt", str(png), None, truth,
                        True, {}, stem)
            )  # fmt: skip
        if rows:
            yield folder.name, rows


def unlv_docs(detector, readers: Sequence[Recogniser]) -> Iterator[tuple[str, list[RealRow]]]:
    """The zone lines of bench/reallines.py, matched to ground truth by text."""
    from bench import reallines

    for page in reallines.UNLV_PAGES:
        image_path = str(reallines.UNLV / f"{page}.tif")
        image = _image(image_path)
        rows = []
        boxes = []
        for z, zone in enumerate(reallines._zones(page)):
            zone_image = crop(image, zone)
            found = [r.bbox for r in detector.detect(zone_image)]
            for n, box in enumerate(reallines._merge_into_lines(found)):
                boxes.append(
                    (f"{page}/z{z}/l{n}",
                     (zone.x0 + box.x0, zone.y0 + box.y0, zone.x0 + box.x1, zone.y0 + box.y1))
                )  # fmt: skip
        crops = [crop(image, ir.BBox(x0=b[0], y0=b[1], x1=b[2], y1=b[3])) for _, b in boxes]
        reads = {reader.name: read_all(reader, crops) for reader in readers}
        truths = [
            t for t in (reallines.UNLV / f"{page}.txt").read_text(encoding="utf-8").splitlines()
        ]
        from ocrfleet.metrics import cer, normalize_ws

        used: set[int] = set()
        for k, (line_id, box) in enumerate(boxes):
            outputs = [normalize_ws(r[k][0]) for r in reads.values() if r[k] is not None]
            best = None
            for n, truth in enumerate(truths):
                if not normalize_ws(truth) or not outputs:
                    continue
                distance = min(cer(output, truth) for output in outputs)
                if best is None or distance < best[0]:
                    best = (distance, n)
            if best is None or best[0] > reallines.MAX_MATCH_CER or best[1] in used:
                continue
            used.add(best[1])
            truth = normalize_ws(truths[best[1]])
            if "~" in truth:
                continue
            rows.append(
                RealRow("unlv", page, line_id, "det", image_path, box, truth, True,
                        {name: r[k] for name, r in reads.items()}, str(best[1]))
            )  # fmt: skip
        yield page, rows


def pdf_docs(settings) -> Iterator[tuple[str, list[RealRow]]]:
    """Each manual's `PDF_PAGES` pages (at the middles of equal stretches of it, so title
    pages are rarely among them), one sub-document through `iter_pages_with_text`; the page
    renders are kept under `OUT / "pdf"` for the rows' crops."""
    import gzip
    import io

    import pypdfium2 as pdfium

    from ocrfleet.pipeline import textlayer
    from ocrfleet.pipeline.split import iter_pages_with_text

    for manual in map(Path, DEBIAN_MANUALS):
        if not manual.is_file():
            print(
                f"pdf: {manual} is missing (its Debian package is not installed)", file=sys.stderr
            )
            continue
        doc = manual.parent.name
        data = manual.read_bytes()
        source = pdfium.PdfDocument(gzip.decompress(data) if manual.suffix == ".gz" else data)
        count = len(source)
        chosen = sorted(
            {min(count - 1, int((k + 0.5) * count / PDF_PAGES)) for k in range(PDF_PAGES)}
        )
        part = pdfium.PdfDocument.new()
        part.import_pages(source, chosen)
        buffer = io.BytesIO()
        part.save(buffer)
        part.close()
        source.close()
        rows = []
        for index, (image, layer) in zip(
            chosen, iter_pages_with_text(buffer.getvalue(), settings), strict=True
        ):
            if not textlayer.judge(layer, image).good:
                continue
            path = OUT / "pdf" / f"{doc}-p{index + 1}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            image.save(path)
            regions, candidates = textlayer.reading(layer)
            for region, candidate in zip(regions, candidates, strict=True):
                b = region.bbox
                line = f"p{index + 1}/l{region.number}"
                rows.append(
                    RealRow("pdf", doc, f"{doc}/{line}", "layer", str(path),
                            (b.x0, b.y0, b.x1, b.y1), candidate.text, True, {}, line)
                )  # fmt: skip
        if rows:
            yield doc, rows


# ---- reading and the cache --------------------------------------------------------------


Reading = tuple[str, float | None, float | None]


def read_all(reader: Recogniser, crops: Sequence[Image.Image]) -> list[Reading | None]:
    """Every crop's reading in one call; one at a time if the batch fails."""
    try:
        out = read_with_words(reader, list(crops))
        return [(r.text, r.confidence, r.word_confidence) for r in out]
    except Exception:  # noqa: BLE001 - find the crop that fails, read the rest
        readings: list[Reading | None] = []
        for one in crops:
            try:
                (r,) = read_with_words(reader, [one])
                readings.append((r.text, r.confidence, r.word_confidence))
            except Exception as error:  # noqa: BLE001 - a failed read is recorded as None
                print(f"{reader.name} cannot read a {one.size} crop: {error}", file=sys.stderr)
                readings.append(None)
        return readings


def _engine_key(reader: Recogniser) -> str:
    return f"{reader.name}@{reader.version}"


def cache_path(set_name: str, shard: tuple[int, int] = (0, 1)) -> Path:
    k, n = shard
    return OUT / (f"{set_name}.jsonl" if n == 1 else f"{set_name}.{k}of{n}.jsonl")


def load_rows(set_name: str, *, ctc: bool = False) -> list[RealRow]:
    """The cached rows of one set (all its shards), readings keyed by engine name, labels as
    audited; with `ctc`, each row's CTC evidence too (the `--ctc` pass must have run; rows
    of a source it does not read, `CTC_SOURCES`, come without)."""
    from bench.label_audit import audited

    paths = sorted(OUT.glob(f"{set_name}.jsonl")) + sorted(
        p for p in OUT.glob(f"{set_name}.*of*.jsonl") if not p.name.startswith(f"{set_name}.ctc.")
    )
    if not paths:
        raise FileNotFoundError(
            f"{cache_path(set_name)} is missing; run `python bench/realrows.py`"
        )
    lines = [line for path in paths for line in path.read_text(encoding="utf-8").splitlines()]
    evidence = load_ctc(set_name) if ctc else {}
    rows = []
    for line in sorted(lines, key=lambda text: json.loads(text)["id"]):
        record = json.loads(line)
        if "line" not in record:
            raise ValueError(
                f"{set_name} row {record['id']} has no ground-truth line identity (cached by "
                f"an older realrows.py); run `python bench/realrows.py --sets {set_name}` "
                f"(readings are reused, no engine reads again)"
            )
        reads = {
            key.split("@", 1)[0]: (None if value is None else (*value, None)[:3])
            for key, value in record["reads"].items()
        }
        bbox = None if record["bbox"] is None else tuple(record["bbox"])
        annotation, line_id = record["truth"], str(record["line"])
        truth = audited(set_name, record["doc"], line_id, annotation)
        if set_name == "sroie" and record["source"] == "det":
            box = _matched_box(record["doc"], bbox, annotation, line_id)
            if box is None:
                continue  # cached under a looser matching rule
            truth = visible_truth(truth, box, bbox)
        row = RealRow(
            record["set"], record["doc"], record["id"], record["source"], record["image"],
            bbox, truth, record["case_sensitive"], reads, line_id,
            versions=_versions(record["reads"]),
        )  # fmt: skip
        if ctc and row.source in CTC_SOURCES[set_name]:
            found = evidence.get(crop_id(row))
            if found is None:
                raise ValueError(
                    f"{set_name} row {row.id} has no CTC evidence; run "
                    f"`python bench/realrows.py --ctc --sets {set_name}`"
                )
            row = _merged(row, found)
        rows.append(row)
    return rows


def _matched_box(doc: str, bbox, annotation: str, line: str) -> tuple[int, int, int, int] | None:
    """The ground-truth box of the row's line, if the row's region still matches it."""
    for box, text, n in receipt_lines(doc):
        if text == annotation and str(n) == line and same_line(bbox, box):
            return box
    return None


def visible_truth(text: str, truth_box: Sequence[int], crop_box: Sequence[int]) -> str:
    """`text`, the line annotated in `truth_box`, without the punctuation at either end
    that lies outside `crop_box`: a region that stops short of a " :" printed apart from
    its words ("TOTAL SALES (EXCLUDING GST)      :") shows no colon, so a reading without
    one is right. The characters are placed evenly across the truth box; one goes only
    when its whole place lies outside the crop (annotated boxes run past the ink), and a
    letter or digit never does (a region missing one is not matched to the line)."""
    if not text:
        return text
    width = (truth_box[2] - truth_box[0]) / len(text)
    start, end = 0, len(text)
    while (
        end > 0 and not text[end - 1].isalnum() and truth_box[0] + (end - 1) * width >= crop_box[2]
    ):
        end -= 1
    while (
        start < end
        and not text[start].isalnum()
        and truth_box[0] + (start + 1) * width <= crop_box[0]
    ):
        start += 1
    return text[start:end].strip() or text


def fill(set_name: str, settings, shard: tuple[int, int] = (0, 1)) -> None:
    from ocrfleet.engines import load_detector
    from ocrfleet.scorers import second_readers

    readers = [r for r in second_readers(settings) if r.name in FIRST_PASS]
    keys = {reader.name: _engine_key(reader) for reader in readers}
    path = cache_path(set_name, shard)
    # Readings already cached under these engine versions are reused, the rest re-read.
    cached: dict[str, dict] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            cached[record["id"]] = record
    detector = load_detector(settings)
    docs = {
        "sroie": lambda: sroie_docs(detector, shard),
        "uw3": uw3_docs,
        "unlv": lambda: unlv_docs(detector, readers),
        "pdf": lambda: pdf_docs(settings),
    }[set_name]()
    path.parent.mkdir(parents=True, exist_ok=True)
    started, count = time.perf_counter(), 0
    records: dict[str, dict] = {}
    for n_doc, (doc, rows) in enumerate(docs):
        if set_name != "sroie" and n_doc % shard[1] != shard[0]:
            continue
        reads = {}
        crops: list[Image.Image] | None = None
        for reader in readers:
            key = keys[reader.name]
            if all(reader.name in row.reads for row in rows):
                reads[reader.name] = [row.reads[reader.name] for row in rows]
            elif all(_cached(cached.get(row.id, {}), row, key) for row in rows):
                reads[reader.name] = [cached[row.id]["reads"][key] for row in rows]
            else:
                crops = crops or [row.crop() for row in rows]
                reads[reader.name] = read_all(reader, crops)
                count += len(rows)
        for n, row in enumerate(rows):
            records[row.id] = {
                "set": row.set, "doc": row.doc, "id": row.id, "source": row.source,
                "image": row.image, "bbox": row.bbox, "truth": row.truth, "line": row.line,
                "case_sensitive": row.case_sensitive,
                "reads": {keys[name]: value[n] for name, value in reads.items()},
            }  # fmt: skip
        if crops is not None:
            _write(path, records, cached)
            print(f"{set_name} {doc}: {len(rows)} rows ({time.perf_counter() - started:.0f} s)")
    _write(path, records, {})
    print(f"{set_name}: {len(records)} rows, {count} new readings")


def _cached(record: dict, row: RealRow, key: str) -> bool:
    """A cached reading of this row's very crop (a detector change moves the boxes under
    the same row ids) under this engine version, in the current (text, confidence, least
    word confidence) form; older two-value readings are read again."""
    reads = record.get("reads", {})
    same_crop = record.get("bbox") == (None if row.bbox is None else list(row.bbox))
    return same_crop and key in reads and (reads[key] is None or len(reads[key]) == 3)


def _write(path: Path, records: dict[str, dict], rest: dict[str, dict]) -> None:
    """This run's records, then cached ones it has not reached yet (a partial run loses
    nothing), atomically."""
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for record in [*records.values(), *(r for k, r in rest.items() if k not in records)]:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    tmp.replace(path)


# ---- the CTC pass ----------------------------------------------------------------------


@dataclass(frozen=True)
class CtcRecord:
    """What one CTC model says about one crop, as cached: its greedy reading, the evidence
    on it, and log P(text | crop) for the texts training asks about."""

    engine: str
    text: str
    min_char_prob: float
    min_margin: float
    mean_log_prob: float
    log_likelihoods: dict[str, float]

    def scores(self):
        """As the scorer's `CtcScores`; a text not cached is an error that says what to run."""
        from ocrfleet.scorers.features import CtcScores

        def log_likelihood(text: str) -> float:
            try:
                return self.log_likelihoods[text]
            except KeyError:
                raise KeyError(
                    f"no cached {self.engine} likelihood of {text!r}; run "
                    f"`python bench/realrows.py --ctc`"
                ) from None

        return CtcScores(
            self.engine, self.text, self.min_char_prob, self.min_margin, self.mean_log_prob,
            log_likelihood,
        )  # fmt: skip


def crop_id(row: RealRow) -> str:
    """The crop's identity in the CTC cache: its image and box (the same pixels)."""
    return hashlib.sha1(
        json.dumps([row.image, row.bbox]).encode(), usedforsecurity=False
    ).hexdigest()


def ctc_path(set_name: str, shard: tuple[int, int] = (0, 1)) -> Path:
    k, n = shard
    return OUT / (f"{set_name}.ctc.jsonl" if n == 1 else f"{set_name}.ctc.{k}of{n}.jsonl")


def _ctc_records(set_name: str) -> dict[str, dict]:
    # The newest file last, so its record of a crop wins: a pass over the whole set after a
    # sharded one (a corrected label's texts) rewrites crops the shards' files also hold.
    paths = sorted(
        [*OUT.glob(f"{set_name}.ctc.jsonl"), *OUT.glob(f"{set_name}.ctc.*of*.jsonl")],
        key=lambda path: path.stat().st_mtime_ns,
    )
    records = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            records[record["crop"]] = record
    return records


def load_ctc(set_name: str) -> dict[str, dict]:
    """crop id -> its record of the CTC pass (as `ctc_records` gives them)."""
    return _ctc_records(set_name)


def texts_to_score(row: RealRow, partner: RealRow | None, greedy: Sequence[str]) -> set[str]:
    """Every text whose likelihood training may ask for on this crop, as the scorer sees
    them (whitespace folded): each reading, the augmentation's texts
    (bench/train_consensus.py), and each model's greedy reading (also as given); each also
    without the whitespace the label rule drops (`CtcScores.label_log_likelihood`)."""
    from bench.train_consensus import augmented_texts
    from ocrfleet.labels import tight
    from ocrfleet.metrics import normalize_ws

    texts = {r[0] for r in row.reads.values() if r is not None}
    texts.update(augmented_texts(row, partner))
    texts.update(greedy)
    texts = {normalize_ws(t) for t in texts} | set(greedy)
    return texts | {tight(t) for t in texts}


def _finite(value: float) -> float:
    """JSON has no -inf: a text the frames cannot emit is cached at a very low value."""
    return max(float(value), -1e6)


def ctc_records(
    rows: Sequence[RealRow], partner: Callable[[RealRow], RealRow | None], readers: Sequence
) -> list[dict[str, dict]]:
    """Per row: `reads`, the CTC readers' readings the row lacks (`name@version` -> reading),
    and `models`, per CTC reader its greedy reading, the evidence on it and the
    log-likelihood of every text of `texts_to_score`; the crops read in one batch each."""
    crops = [row.crop() for row in rows]
    reads: dict[str, list[Reading | None]] = {}
    for reader in readers:  # a reading the first pass did not make; primes ctc.RECENT
        if any(reader.name not in row.reads for row in rows):
            reads[reader.name] = read_all(reader, crops)
    posteriors = {reader.name: reader.posteriors(crops) for reader in readers}
    extras = [
        {_engine_key(r): reads[r.name][k] for r in readers if r.name in reads}
        for k in range(len(rows))
    ]
    merged = {
        row.id: _merged(row, {"reads": extra, "models": {}})
        for row, extra in zip(rows, extras, strict=True)
    }

    def partner_read(row: RealRow) -> RealRow | None:
        found = partner(row)
        return None if found is None else merged.get(found.id, found)

    out = []
    for k, row in enumerate(rows):
        greedy = [posteriors[reader.name][k].text() for reader in readers]
        texts = sorted(texts_to_score(merged[row.id], partner_read(row), greedy))
        models = {}
        for reader in readers:
            posterior = posteriors[reader.name][k]
            evidence = posterior.evidence()
            models[_engine_key(reader)] = {
                "text": posterior.text(),
                "evidence": [evidence.min_char_prob, evidence.min_margin, evidence.mean_log_prob],
                "ll": {t: _finite(posterior.log_likelihood(t)) for t in texts},
            }
        out.append({"reads": extras[k], "models": models})
    return out


def with_ctc(rows: Sequence[RealRow], records: Sequence[dict[str, dict]]) -> list[RealRow]:
    """`rows` with their CTC records (as `ctc_records` gives them)."""
    return [_merged(row, record) for row, record in zip(rows, records, strict=True)]


def _merged(row: RealRow, record: dict) -> RealRow:
    reads = {name.split("@", 1)[0]: _reading(v) for name, v in record["reads"].items()}
    versions = {**row.versions, **_versions(record["reads"]), **_versions(record["models"])}
    return replace(
        row, reads={**row.reads, **reads}, ctc=_parse_models(record["models"]), versions=versions
    )


def _versions(keyed: dict) -> dict[str, str]:
    """engine -> version from a cache record's `name@version` keys."""
    return dict(tuple(key.split("@", 1)) for key in keyed if "@" in key)


def _reading(value) -> Reading | None:
    return None if value is None else (*value, None)[:3]


def _parse_models(models: dict[str, dict]) -> dict[str, CtcRecord]:
    return {
        name.split("@", 1)[0]: CtcRecord(name.split("@", 1)[0], m["text"], *m["evidence"], m["ll"])
        for name, m in models.items()
    }


def fill_ctc(set_name: str, settings, shard: tuple[int, int] = (0, 1)) -> None:
    """The CTC pass over the cached rows of `set_name`: every crop whose record is missing,
    from other model versions, or lacks a text, is read by the CTC models (batched per
    document); tesseract never reads."""
    from bench.train_consensus import partner_of
    from ocrfleet.scorers import second_readers

    readers = [r for r in second_readers(settings) if callable(getattr(r, "posteriors", None))]
    if not readers:
        raise RuntimeError("no CTC reader (one with `posteriors`) among the second readers")
    keys = {reader.name: _engine_key(reader) for reader in readers}
    cached = _ctc_records(set_name)
    rows = [
        _merged(row, cached[crop_id(row)]) if crop_id(row) in cached else row
        for row in load_rows(set_name)
    ]
    partner = partner_of(rows)
    path = ctc_path(set_name, shard)
    records: dict[str, dict] = {}
    started, count = time.perf_counter(), 0
    for n_doc, doc in enumerate(sorted({row.doc for row in rows})):
        if n_doc % shard[1] != shard[0]:
            continue
        todo = []
        for row in (r for r in rows if r.doc == doc and r.source in CTC_SOURCES[set_name]):
            record = cached.get(crop_id(row))
            if record is not None and set(record["models"]) == set(keys.values()):
                greedy = [m["text"] for m in record["models"].values()]
                wanted = texts_to_score(row, partner(row), greedy)
                if all(wanted <= set(m["ll"]) for m in record["models"].values()):
                    records[crop_id(row)] = record
                    continue
            todo.append(row)
        if not todo:
            continue
        for row, record in zip(todo, ctc_records(todo, partner, readers), strict=True):
            before = cached.get(crop_id(row), {}).get("reads", {})
            kept = {k: v for k, v in before.items() if k in keys.values()}
            records[crop_id(row)] = {
                "crop": crop_id(row), "id": row.id, "reads": {**kept, **record["reads"]},
                "models": record["models"],
            }  # fmt: skip
        count += len(todo)
        _write(path, records, {})
        print(f"{set_name} {doc}: {len(todo)} crops ({time.perf_counter() - started:.0f} s)")
    _write(path, records, {})
    print(f"{set_name}: {len(records)} crops, {count} read by the CTC models")


def main(argv: list[str] | None = None) -> None:
    from ocrfleet.config import Settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--shard", default="0/1", help="k/n: this process reads every n-th doc")
    parser.add_argument(
        "--ctc", action="store_true", help="the CTC pass over the cached rows (after the first)"
    )
    args = parser.parse_args(argv)
    k, n = (int(v) for v in args.shard.split("/"))
    for set_name in args.sets.split(","):
        (fill_ctc if args.ctc else fill)(set_name, Settings(layout=LAYOUT), (k, n))


if __name__ == "__main__":
    main()
