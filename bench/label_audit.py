"""The label audit: ground-truth transcripts the crops contradict, corrected in a versioned
file that every row builder applies (bench/realrows.py's truth loaders).

`bench/labels/corrections.csv`, one correction a row: `set,document,line,original,corrected,
reason`. `set` is sroie|uw3|unlv|pdf as in bench/realrows.py, `document` the realrows `doc`,
`line` the ground-truth line's identity in its annotation (sroie: the 0-based row of
box/<id>.csv; uw3: the line image's file stem; unlv: the index of the line in the page's
.txt, as bench/realrows.py matches it; pdf: `p<page>/l<line>`, the text layer's line in
reading order, whose text is the annotation), `original` the annotation's text as the loader reads
it (so a correction whose original no longer matches is an error, never a silent no-op),
`corrected` what the crop shows, `reason` a short phrase.
Only what the crop clearly shows is corrected; an ambiguous crop keeps its annotation.

`bench/labels/looked.csv` lists every line looked at (`set,document,line,original,why,
readings`, `why` being the listing rule that brought it: `all_agree` where every engine
read the same text and the label says wrong, `two_agree` where two engines read alike and
none reads the label, `rest` for every other line where some engine disagrees with the
label, in the seeded random order they were looked at; `scored_wrong` where RapidOCR's
candidate of a realrows crop scores at least `SCORED_FLOOR` out of fold and the label says
wrong: the lines that set the verifier's thresholds; `layer_underscore` where RapidOCR reads
a text-layer line as its layer does but with underscores where the layer has spaces), so the
counts are reproducible:

    python bench/label_audit.py            # lines listed, looked at, changed, by reason
    python bench/label_audit.py read       # every engine's reading of the ground-truth crops
    python bench/label_audit.py list       # the lines to look at -> bench/labels/looked.csv
    python bench/label_audit.py sheets     # contact sheets of them -> bench/out/label_audit/
    python bench/label_audit.py scored     # add the `scored_wrong`, `layer_underscore` lines
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LABELS = ROOT / "bench" / "labels"
CORRECTIONS = LABELS / "corrections.csv"
LOOKED = LABELS / "looked.csv"
OUT = ROOT / "bench" / "out" / "label_audit"
COLUMNS = ("set", "document", "line", "original", "corrected", "reason")
SEED = 17  # the order the `rest` lines were looked at
# RapidOCR candidates labelled wrong that score at least this out of fold are listed: a
# label wrong there moves the threshold more than any other line's (bench/train_consensus.py).
SCORED_FLOOR = 0.8


class StaleCorrection(ValueError):
    """A correction's `original` is not the annotation's text any more."""


@dataclass(frozen=True)
class Correction:
    set: str
    document: str
    line: str
    original: str
    corrected: str
    reason: str


def read_corrections(path: Path) -> dict[tuple[str, str, str], Correction]:
    """The corrections in `path`, keyed (set, document, line); a malformed file is an error
    that names its row."""
    from bench.realrows import SETS

    out: dict[tuple[str, str, str], Correction] = {}
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}: the columns must be {','.join(COLUMNS)}")
        for number, row in enumerate(reader, start=2):
            if None in row or any(row[c] is None for c in COLUMNS):
                raise ValueError(f"{path}:{number}: expected {len(COLUMNS)} fields")
            fix = Correction(**{column: row[column] for column in COLUMNS})
            if fix.set not in SETS:
                raise ValueError(f"{path}:{number}: unknown set {fix.set!r}")
            if not fix.corrected.strip() or not fix.reason.strip():
                raise ValueError(f"{path}:{number}: a correction needs its text and reason")
            if fix.corrected == fix.original:
                raise ValueError(f"{path}:{number}: the correction changes nothing")
            key = (fix.set, fix.document, fix.line)
            if key in out:
                raise ValueError(f"{path}:{number}: {key} is corrected twice")
            out[key] = fix
    return out


@lru_cache(maxsize=1)
def corrections() -> dict[tuple[str, str, str], Correction]:
    """The repository's corrections (bench/labels/corrections.csv)."""
    return read_corrections(CORRECTIONS)


def audited(set_name: str, document: str, line: str, original: str) -> str:
    """The line's truth after the audit: the correction's text where there is one, else the
    annotation's. Raises `StaleCorrection` when the annotation no longer says what the
    correction corrected."""
    fix = corrections().get((set_name, document, str(line)))
    if fix is None:
        return original
    if fix.original != original:
        raise StaleCorrection(
            f"{CORRECTIONS.name}: {set_name} {document} line {line} corrects "
            f"{fix.original!r}, but the annotation says {original!r}"
        )
    return fix.corrected


# ---- the audit: read the ground-truth crops, list the suspects, draw them ----------------


@dataclass(frozen=True)
class Line:
    """One ground-truth line and where its crop is."""

    set: str
    document: str
    line: str
    original: str
    case_sensitive: bool
    image: str
    bbox: tuple[int, int, int, int] | None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.set, self.document, self.line)


def sroie_lines() -> Iterator[Line]:
    """Every SROIE line with a transcript, its box clipped to the receipt."""
    from bench.realrows import SROIE, _image

    for csv_path in sorted((SROIE / "box").glob("*.csv")):
        receipt = csv_path.stem
        path = str(SROIE / "images" / f"{receipt}.jpg")
        width, height = _image(path).size
        for n, row in enumerate(csv_path.read_text(encoding="utf-8").splitlines()):
            parts = row.split(",", 8)
            if len(parts) < 9 or not parts[8].strip():
                continue
            xs, ys = [int(v) for v in parts[0:8:2]], [int(v) for v in parts[1:8:2]]
            box = (max(0, min(xs)), max(0, min(ys)), min(width, max(xs)), min(height, max(ys)))
            if box[2] > box[0] and box[3] > box[1]:
                yield Line("sroie", receipt, str(n), parts[8].strip(), False, path, box)


def uw3_lines() -> Iterator[Line]:
    from bench.realrows import UW3_BOOK

    for folder in sorted(p for p in UW3_BOOK.iterdir() if p.is_dir()):
        for png in sorted(folder.glob("*.bin.png")):
            gt = png.with_name(png.name.replace(".bin.png", ".gt.txt"))
            if gt.is_file():
                stem = png.name.split(".")[0]
                text = gt.read_text(encoding="utf-8").strip()
                yield Line("uw3", folder.name, stem, text, True, str(png), None)


def _crop(line: Line):
    from bench.realrows import _image
    from ocrfleet import ir
    from ocrfleet.pipeline.regions import crop

    page = _image(line.image)
    if line.bbox is None:
        return page
    x0, y0, x1, y1 = line.bbox
    return crop(page, ir.BBox(x0=x0, y0=y0, x1=x1, y1=y1))


def _label_ok(text: str | None, line: Line) -> bool:
    from ocrfleet.labels import same_text

    return text is not None and same_text(text, line.original, case_sensitive=line.case_sensitive)


def read(batch: int = 64) -> None:
    """Every engine's reading of the ground-truth crops, cached in OUT/readings.jsonl. The
    first reader (RapidOCR) reads every crop; the others only crops it reads differently
    from the label (the others cannot turn such a line into an "every engine agrees and
    the label says wrong" one), which bounds tesseract's time. UNLV's lines are the ones
    bench/realrows.py matches, read by every reader."""
    from bench import realrows
    from ocrfleet.config import Settings
    from ocrfleet.engines import load_detector
    from ocrfleet.scorers import second_readers

    settings = Settings(layout=realrows.LAYOUT)
    readers = second_readers(settings) + _third_readers(settings)
    path = OUT / "readings.jsonl"
    done: dict[tuple[str, str, str], dict] = {}
    if path.is_file():
        for text in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(text)
            done[(record["set"], record["document"], record["line"])] = record
    OUT.mkdir(parents=True, exist_ok=True)
    lines = [*sroie_lines(), *uw3_lines()]
    records = {line.key: done.get(line.key) or {**_record(line), "reads": {}} for line in lines}
    for n, reader in enumerate(readers):
        todo = [
            line for line in lines
            if reader.name not in records[line.key]["reads"]
            and (n == 0 or not _label_ok(records[line.key]["reads"].get(readers[0].name), line))
        ]  # fmt: skip
        for start in range(0, len(todo), batch):
            chunk = todo[start : start + batch]
            reads = realrows.read_all(reader, [_crop(line) for line in chunk])
            for line, reading in zip(chunk, reads, strict=True):
                records[line.key]["reads"][reader.name] = None if reading is None else reading[0]
            _save(path, records)
            print(f"{reader.name}: {start + len(chunk)} of {len(todo)}", flush=True)
    detector = load_detector(settings)
    for page, rows in realrows.unlv_docs(detector, readers):
        for row in rows:  # truth: the annotation's text; line: its index in the page's .txt
            line = Line("unlv", page, row.line, row.truth, True, row.image, row.bbox)
            reads = {name: None if r is None else r[0] for name, r in row.reads.items()}
            records[line.key] = {**_record(line), "reads": reads}
    _save(path, records)


def _third_readers(settings) -> list:
    """EasyOCR's recogniser (issue 17's third reader), by the engines' own loader."""
    from ocrfleet.engines import load_recognisers

    return load_recognisers(settings.model_copy(update={"engines": ["easyocr"]}))


def _record(line: Line) -> dict:
    return {
        "set": line.set, "document": line.document, "line": line.line,
        "original": line.original, "case_sensitive": line.case_sensitive,
        "image": line.image, "bbox": line.bbox,
    }  # fmt: skip


def _save(path: Path, records: dict) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for record in records.values():
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    tmp.replace(path)


def load_readings() -> list[tuple[Line, dict[str, str | None]]]:
    records = (OUT / "readings.jsonl").read_text(encoding="utf-8").splitlines()
    out = []
    for text in records:
        r = json.loads(text)
        bbox = None if r["bbox"] is None else tuple(r["bbox"])
        line = Line(
            r["set"], r["document"], r["line"], r["original"], r["case_sensitive"],
            r["image"], bbox,
        )  # fmt: skip
        out.append((line, r["reads"]))
    return out


def suspects(
    readings: list[tuple[Line, dict[str, str | None]]], seed: int = SEED
) -> list[tuple[Line, dict[str, str | None], str]]:
    """(line, readings, why) to look at: every line that every engine read alike while the
    label says wrong (`all_agree`), every line where two engines read alike and no engine
    reads the label (`two_agree`), then every other line where some engine disagrees with the
    label (`rest`), shuffled with `seed`."""
    from ocrfleet.labels import same_text

    engines = sorted({name for _, reads in readings for name in reads})
    agree, two, rest = [], [], []
    for line, reads in readings:
        texts = [reads[name] for name in engines if name in reads]  # a reader may skip it
        if all(_label_ok(text, line) for text in texts):
            continue
        read = [t for t in texts if t is not None and not _label_ok(t, line)]
        pairs = sum(
            same_text(a, b, case_sensitive=line.case_sensitive)
            for i, a in enumerate(read)
            for b in read[i + 1 :]
        )
        if len(read) == len(texts) and pairs == len(read) * (len(read) - 1) // 2:
            agree.append((line, reads, "all_agree"))
        elif pairs and not any(_label_ok(text, line) for text in texts):
            two.append((line, reads, "two_agree"))
        else:
            rest.append((line, reads, "rest"))
    return agree + two + random.Random(seed).sample(rest, len(rest))


def write_listing(listed: list[tuple[Line, dict[str, str | None], str]]) -> None:
    LABELS.mkdir(parents=True, exist_ok=True)
    with LOOKED.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(("set", "document", "line", "original", "why", "readings"))
        for line, reads, why in listed:
            shown = json.dumps(reads, ensure_ascii=False, sort_keys=True)
            writer.writerow((line.set, line.document, line.line, line.original, why, shown))


def read_listing() -> list[dict[str, str]]:
    with LOOKED.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def scored_wrong(floor: float = SCORED_FLOOR) -> list[tuple[Line, dict[str, str | None], str]]:
    """Every realrows line whose RapidOCR candidate scores at least `floor` out of fold (the
    shipped calibration over bench/train_consensus.py's folds) while its label says wrong,
    highest first, with each engine's reading of the crop; a line many crops share comes once."""
    import numpy as np

    from bench.realrows import load_rows
    from bench.train_consensus import SETS, load_examples, out_of_fold
    from ocrfleet.scorers.consensus import WEIGHTS_PATH, load_calibration

    ex, x, ok = load_examples(SETS)
    y = np.array(ex.labels, dtype=bool)
    raw = np.zeros(len(y))
    raw[ok] = out_of_fold(x[ok], y[ok], [d for d, k in zip(ex.docs, ok, strict=True) if k])
    prob = load_calibration(WEIGHTS_PATH).calibration(raw)
    rows = {f"{row.set}/{row.id}": row for name in SETS for row in load_rows(name, ctc=True)}
    annotations = {name: _annotations(name) for name in SETS}
    out: dict[tuple[str, str, str], tuple[Line, dict[str, str | None], str]] = {}
    for i in np.argsort(-prob, kind="stable"):
        if not ok[i] or y[i] or ex.units[i].engine != "rapidocr" or prob[i] < floor:
            continue
        row = rows[ex.rows[i]]
        original = annotations[row.set][row.id]
        line = Line(row.set, row.doc, row.line, original, row.case_sensitive, row.image, row.bbox)
        reads = {name: None if r is None else r[0] for name, r in row.reads.items()}
        reads.update({name: c.text for name, c in row.ctc.items() if name not in reads})
        out.setdefault(line.key, (line, reads, "scored_wrong"))
    for row in rows.values():
        original = annotations[row.set][row.id]
        reading = row.reads.get("rapidocr")
        if row.set == "pdf" and reading is not None and _underscored(reading[0], original):
            line = Line(row.set, row.doc, row.line, original, True, row.image, row.bbox)
            reads = {name: None if r is None else r[0] for name, r in row.reads.items()}
            out.setdefault(line.key, (line, reads, "layer_underscore"))
    return list(out.values())


def _underscored(reading: str, layer: str) -> bool:
    """`reading` is `layer` with underscores where the layer has spaces (TeX draws an
    identifier's underscore as a rule, and its text layer holds a space there)."""
    from ocrfleet.labels import canonical

    return reading.count("_") > layer.count("_") and canonical(
        reading.replace("_", " ")
    ) == canonical(layer.replace("_", " "))


def _annotations(set_name: str) -> dict[str, str]:
    """Row id -> the annotation's own text (the truth before the audit), from the cache."""
    from bench.realrows import OUT as ROWS

    found: dict[str, str] = {}
    for path in sorted(ROWS.glob(f"{set_name}.*jsonl")):
        if not path.name.startswith(f"{set_name}.ctc."):
            for text in path.read_text(encoding="utf-8").splitlines():
                record = json.loads(text)
                found[record["id"]] = record["truth"]
    return found


def sheets(per_sheet: int = 10, width: int = 900) -> list[Path]:
    """Contact sheets of the listed lines: each crop, its label and every reading beneath."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.truetype("/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf", 15)
    by_key = {line.key: line for line, _ in load_readings()}
    listed = read_listing()
    paths = []
    for first in range(0, len(listed), per_sheet):
        tiles = []
        for k, row in enumerate(listed[first : first + per_sheet], start=first):
            line = by_key[(row["set"], row["document"], row["line"])]
            image = _crop(line).convert("RGB")
            w, h = image.size  # lines 40 to 80 px high, never wider than the sheet
            scale = min(max(1.0, 40 / h), 80 / h, (width - 20) / w)
            image = image.resize((max(1, int(w * scale)), max(1, int(h * scale))))
            reads = json.loads(row["readings"])
            text = [f"#{k} {row['set']} {row['document']} line {row['line']} ({row['why']})",
                    f"label    : {row['original']!r}"]  # fmt: skip
            text += [f"{name:9}: {value!r}" for name, value in sorted(reads.items())]
            tile = Image.new("RGB", (width, image.height + 20 * len(text) + 16), "white")
            tile.paste(image, (10, 6))
            draw = ImageDraw.Draw(tile)
            for n, caption in enumerate(text):
                draw.text((10, image.height + 10 + 20 * n), caption, fill="black", font=font)
            draw.line((0, tile.height - 1, width, tile.height - 1), fill="red")
            tiles.append(tile)
        sheet = Image.new("RGB", (width, sum(t.height for t in tiles)), "white")
        y = 0
        for tile in tiles:
            sheet.paste(tile, (0, y))
            y += tile.height
        OUT.mkdir(parents=True, exist_ok=True)
        path = OUT / f"sheet-{first // per_sheet:03d}.png"
        sheet.save(path)
        paths.append(path)
    return paths


def counts() -> None:
    """What the note cites: lines read, lines listed and looked at (by set and listing rule),
    changed (by set, listing rule and reason)."""
    from bench.realrows import SETS

    fixes = corrections()
    if (OUT / "readings.jsonl").is_file():
        readings = load_readings()
        print(f"ground-truth lines read: {len(readings)}; RapidOCR right by the label, before")
        print("and after the audit:")
        for name in SETS:
            own = [(line, reads.get("rapidocr")) for line, reads in readings if line.set == name]
            if not own:
                continue
            before = sum(_label_ok(text, line) for line, text in own)
            after = sum(
                _label_ok(text, replace(line, original=fixes[line.key].corrected))
                if line.key in fixes else _label_ok(text, line)
                for line, text in own
            )  # fmt: skip
            print(f"  {name:6} {len(own):5}  {before / len(own):.4f} -> {after / len(own):.4f}")
    listed = read_listing() if LOOKED.is_file() else []
    print(f"listed and looked at: {len(listed)}")
    for (name, why), n in sorted(Counter((r["set"], r["why"]) for r in listed).items()):
        print(f"  {name:6} {why:10} {n}")
    print(f"changed: {len(fixes)}")
    for name, n in sorted(Counter(f.set for f in fixes.values()).items()):
        print(f"  {name:6} {n}")
    why = {(r["set"], r["document"], r["line"]): r["why"] for r in listed}
    for rule, n in sorted(Counter(why.get(key, "not listed") for key in fixes).items()):
        print(f"  {rule:10} {n}")
    for reason, n in Counter(f.reason for f in fixes.values()).most_common():
        print(f"  {n:4}  {reason}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steps = ("counts", "read", "list", "sheets", "scored")
    parser.add_argument("step", nargs="?", default="counts", choices=steps)
    args = parser.parse_args(argv)
    if args.step == "read":
        read()
    elif args.step == "list":
        listed = suspects(load_readings())
        write_listing(listed)
        print(f"{len(listed)} lines listed in {LOOKED}")
    elif args.step == "scored":
        listed = read_listing()
        seen = {(r["set"], r["document"], r["line"]) for r in listed}
        new = [item for item in scored_wrong() if item[0].key not in seen]
        with LOOKED.open("a", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            for line, reads, why in new:
                shown = json.dumps(reads, ensure_ascii=False, sort_keys=True)
                writer.writerow((line.set, line.document, line.line, line.original, why, shown))
        print(f"{len(new)} lines added to {LOOKED}")
    elif args.step == "sheets":
        print("\n".join(str(path) for path in sheets()))
    else:
        counts()


if __name__ == "__main__":
    main()
