"""How much `ocrfleet run` sends to review, how much of what it accepts is wrong, and whether
anything it accepts is empty over detected text: `python bench/review_share.py`.

Every set goes through the real command, `ocrfleet run --json FILES...` (one process per
set, default settings: the layout detector, RapidOCR, the consensus scorer with its shipped
weights and thresholds), on a throwaway SQLite database and store; the stored results are
then read back with `load_page_result` (the final text of each region, its decision).

Sets (clean printed pages, then receipts):
- `unlv`: every page of realdocs/tesseract_test (two UNLV scans, eurotext, phototest); truth:
  the page `.txt`;
- `olmocr`: the olmOCR-bench sample PDFs (`--olmocr N`: the first N by path; all by
  default); no line truth, so only the flagged share;
- `sroie`: `--receipts N` SROIE receipts spread evenly over the set (truth: the transcript
  lines of box/<id>.csv, as `bench.realrows` reads them, audited labels included). These
  receipts are the consensus scorer's training documents: their numbers are in-sample,
  unless `--held-out`, where the run scores with weights fitted (bench/train_consensus.py,
  on the realrows cache) without those receipts (`OCRFLEET_CONSENSUS_WEIGHTS_PATH`).

An accepted region counts as wrong when its text, in the labels' canonical form (receipts
case-insensitive), is not found in the page's canonical truth between non-alphanumeric
neighbours; canonical text folds line breaks to spaces, so reading order and a region that
spans two transcript lines in order do not count. A receipt's region is also right when its
text is what the transcript boxes it covers say, left to right (SROIE boxes the columns of
one printed line apart). In UNLV's transcripts a run of `~` marks a
character they could not encode ("Caf~~" for "Café"): it matches up to two characters.
"Empty over lines" counts accepted regions that hold text (any category but figure: a text
line, or a table or formula with its lines) whose final text is empty: it must be 0.
Figures hold no lines (theirs are regions of their own) and are left out of the shares.

Then `ocrfleet run --json examples/`: its regions and how many await review (target <= 2).

With `--shortcuts`, the sets' pages (examples/ too, truth: its `.gt.txt` files) go instead
through the one page path in this process (`process_image`, default settings, a PDF page's
text layer included) with the scorer's shortcuts watched: every candidate the scorer leaves
`bounded` (out of its threshold's reach, or screened out) is also scored in full, and the
bench prints how many of the regions a shortcut sent to review the full score would have
accepted, and how many of those are right by the truth (the shortcut's cost). `--explain`
also lists each region flagged on its score with the characters each CTC reader doubts.

    python bench/review_share.py [--olmocr N] [--receipts N [--held-out]]
                                 [--sets unlv,olmocr,sroie,examples]
    python bench/review_share.py --shortcuts [--explain] [--olmocr N] [--sets unlv,olmocr]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from sqlalchemy import func, select

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.corpus import REALDOCS, SROIE, receipt_lines  # noqa: E402
from bench.label_audit import audited  # noqa: E402
from ocrfleet.db import models  # noqa: E402
from ocrfleet.db.persist import load_page_result  # noqa: E402
from ocrfleet.db.session import dispose_engines, session_scope  # noqa: E402
from ocrfleet.labels import canonical  # noqa: E402

OCRFLEET = Path(sys.executable).with_name("ocrfleet")
TARGETS = {"unlv": 0.15, "olmocr": 0.15, "sroie": 0.35}  # flagged share, at most


@dataclass
class Tally:
    regions: int = 0  # regions with text to verify (figures left out)
    flagged: int = 0
    accepted: int = 0
    judged: int = 0  # accepted regions with truth to judge them by
    wrong: int = 0
    empty: int = 0  # accepted with empty text over detected lines
    figures: int = 0
    examples: list[str] = field(default_factory=list)  # accepted texts counted wrong


def run_cli(
    files: list[Path], workdir: Path, extra_env: dict[str, str] | None = None
) -> tuple[str, list[dict]]:
    """`ocrfleet run --json FILES` on its own database and store: (database URL, rows)."""
    workdir.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{workdir / 'ocrfleet.db'}"
    env = {
        **os.environ,
        **(extra_env or {}),
        "OCRFLEET_DATABASE_URL": url,
        "OCRFLEET_STORE_URL": f"file://{workdir / 'store'}",
        "OCRFLEET_CACHE_DIR": str(workdir / "cache"),
    }
    done = subprocess.run(
        [str(OCRFLEET), "run", "--json", *map(str, files)],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
    )
    if done.returncode not in (0, 1):
        raise SystemExit(f"ocrfleet run exited {done.returncode}: {done.stderr[-2000:]}")
    return url, json.loads(done.stdout)


EXAMPLE_TYPES = (".pdf", ".tif", ".jpg", ".png")  # the inputs among examples/' files

UNREADABLE = "~"  # UNLV's mark for a character its transcript could not encode


def found(text: str, truth: str) -> bool:
    """`text` occurs in `truth` with no letter or digit glued to an end that is a letter or
    digit ("1" is not found in "12"; canonical text glues punctuation to its neighbours, so
    an end that is punctuation may touch anything)."""
    before = r"(?<![^\W_])" if text[:1].isalnum() else ""
    after = r"(?![^\W_])" if text[-1:].isalnum() else ""
    if re.search(before + re.escape(text) + after, truth) is not None:
        return True
    return UNREADABLE in truth and any(
        _spans(text, truth, start) for start in range(len(truth)) if truth[start] != " "
    )


def _spans(text: str, truth: str, start: int) -> bool:
    """`text` reads `truth` from `start` on, where a run of UNLV's `~` (a character the
    transcript could not encode: "Caf~~" for "Café", "Texas-~based") stands for up to two
    characters of any kind."""

    @cache
    def match(i: int, j: int) -> bool:
        if i == len(text):
            return True
        if j == len(truth):
            return False
        if truth[j] == UNREADABLE:
            end = j
            while end < len(truth) and truth[end] == UNREADABLE:
                end += 1
            return any(match(i + k, end) for k in range(min(2, len(text) - i) + 1))
        return text[i] == truth[j] and match(i + 1, j + 1)

    return match(0, start)


Box = tuple[int, int, int, int]  # left, top, right, bottom in page pixels


def on_its_line(text: str, bbox, boxes: list[tuple[Box, str]], case_sensitive: bool) -> bool:
    """`text` is what the transcript boxes the region covers (each at least half inside it)
    say, read left to right. SROIE boxes the columns of one printed line apart ("1 X",
    "7.30"), so a region that reads the whole line is not found in the transcript in order."""
    covered = []
    for (left, top, right, bottom), line in boxes:
        area = max(1, (right - left) * (bottom - top))
        width = min(right, bbox.x1) - max(left, bbox.x0)
        height = min(bottom, bbox.y1) - max(top, bbox.y0)
        if width > 0 and height > 0 and width * height >= area / 2:
            covered.append((left, line))
    joined = " ".join(line for _, line in sorted(covered, key=lambda item: item[0]))
    return len(covered) > 1 and canonical(joined, case_sensitive=case_sensitive) == text


def tally(
    url: str,
    rows: list[dict],
    truth_of: dict[str, str],
    counts: Tally,
    case_sensitive: bool,
    boxes_of: dict[str, list[tuple[Box, str]]] | None = None,
) -> None:
    """Count the stored results of `rows` (documents of one `ocrfleet run`) into `counts`."""
    with session_scope(url) as session:
        for row in rows:
            truth = truth_of.get(Path(row["input"]).name)
            page_ids = session.scalars(
                select(models.Page.id)
                .where(models.Page.document_id == row["document_id"])
                .order_by(models.Page.number)
            ).all()
            for page_id in page_ids:
                result = load_page_result(session, page_id)
                by_number = {r.number: r for r in result.regions}
                for decision in result.decisions:
                    region = by_number[decision.region_number]
                    if not region.category.has_text:
                        counts.figures += 1
                        continue
                    counts.regions += 1
                    if not decision.accepted:
                        counts.flagged += 1
                        continue
                    counts.accepted += 1
                    text = canonical(
                        result.region_text(region.number), case_sensitive=case_sensitive
                    )
                    if not text:
                        counts.empty += 1
                    if truth is not None:
                        counts.judged += 1
                        boxes = (boxes_of or {}).get(Path(row["input"]).name, [])
                        if not found(text, truth) and not on_its_line(
                            text, region.bbox, boxes, case_sensitive
                        ):
                            counts.wrong += 1
                            counts.examples.append(f"{Path(row['input']).name}: {text!r}")
    dispose_engines()


@dataclass
class Shortcuts:
    """The regions a shortcut (`bounded`) sent to review, and what the full score says."""

    regions: int = 0  # regions with text to verify
    flagged: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)  # shortcut regions, by flag
    full_accepts: int = 0  # of them, accepted by the full score
    judged: int = 0  # of those, with truth to judge them by
    right: int = 0
    examples: list[str] = field(default_factory=list)
    explained: list[str] = field(default_factory=list)  # flagged on their score (--explain)


class FullScores:
    """The toolkit's scorer, which also scores in full every unit its shortcuts decide
    (`bounded`): `full[(region, engine)]` is that full score."""

    def __init__(self, scorer) -> None:
        self.inner = scorer
        self.name, self.version = scorer.name, scorer.version
        self.full: dict[tuple[int, str], float | None] = {}

    def score(self, units):
        return self.inner.score(units)

    def score_against(self, units, threshold):
        from ocrfleet import ir

        scores = self.inner.score_against(units, threshold)
        cut = [i for i, s in enumerate(scores) if s.verdict == ir.Verdict.bounded]
        for i, full in zip(cut, self.inner.score([units[i] for i in cut]), strict=True):
            self.full[(units[i].region_number, units[i].engine)] = full.score
        return scores


def weak_characters(reader, image) -> str:
    """A CTC reader's reading of `image` with each character it is less than 0.999 sure of,
    in context: `[position 'neighbours'] probability`."""
    (posterior,) = reader.posteriors([image])
    text = posterior.text()
    weak = " ".join(
        f"[{k} {text[max(0, k - 1) : k + 2]!r}] {emitted.prob:.3f}"
        for k, emitted in enumerate(posterior.emitted())
        if emitted.prob < 0.999
    )
    return f"{reader.name} {text!r}: {weak or 'none under 0.999'}"


def shortcuts(
    files: list[Path], truth_of: dict[str, str], case_sensitive: bool, explain: bool = False
) -> Shortcuts:
    """`files` through `process_image` with the scorer watched (see the module's doc); with
    `explain`, each region flagged on its score is listed with every CTC reader's doubtful
    characters (`weak_characters`)."""
    from dataclasses import replace

    from ocrfleet.config import Settings
    from ocrfleet.pipeline.page import process_image
    from ocrfleet.pipeline.regions import crop
    from ocrfleet.pipeline.split import iter_pages_with_text
    from ocrfleet.toolkit import load_toolkit

    settings = Settings()
    base = load_toolkit(settings)
    counts = Shortcuts()
    for path in files:
        truth = truth_of.get(path.name)
        pages = iter_pages_with_text(path.read_bytes(), settings)
        for number, (image, layer) in enumerate(pages, start=1):
            watched = FullScores(base.scorer)
            page = process_image(number, image, replace(base, scorer=watched), layer)
            result = page.result
            by_number = {r.number: r for r in result.regions}
            for decision in result.decisions:
                region = by_number[decision.region_number]
                if not region.category.has_text:
                    continue
                counts.regions += 1
                counts.flagged += not decision.accepted
                key = (decision.region_number, decision.chosen_engine)
                if explain and decision.flag_reason == "low_score" and key not in watched.full:
                    score = next(
                        s.score
                        for s in result.scores
                        if (s.region_number, s.engine) == key and s.score is not None
                    )
                    readers = [r for r in base.scorer.features.readers if hasattr(r, "posteriors")]
                    lines = [weak_characters(r, crop(page.image, region.bbox)) for r in readers]
                    counts.explained.append(
                        f"{path.name}:{number}:{region.number} {key[1]} score {score:.4f} < "
                        f"{decision.threshold}: " + "; ".join(lines)
                    )
                if decision.accepted or key not in watched.full:
                    continue
                reason = str(decision.flag_reason)
                counts.by_reason[reason] = counts.by_reason.get(reason, 0) + 1
                full = watched.full[key]
                if full is None or decision.threshold is None or full < decision.threshold:
                    continue
                counts.full_accepts += 1
                text = canonical(result.region_text(region.number), case_sensitive=case_sensitive)
                if truth is not None:
                    counts.judged += 1
                    counts.right += found(text, truth)
                counts.examples.append(
                    f"{path.name}:{number}: {reason} bound, full {full:.4f} >= "
                    f"{decision.threshold:.4f}: {text!r}"
                )
    return counts


def receipts(count: int) -> list[Path]:
    images = sorted((SROIE / "images").glob("*.jpg"))
    if count >= len(images):
        return images
    step = len(images) / count
    return [images[int(i * step)] for i in range(count)]


def held_out_weights(images: list[Path], out: Path) -> Path:
    """Consensus weights fitted on the realrows cache without these receipts' rows."""
    from bench.realrows import SETS, load_rows
    from bench.train_consensus import train

    held = {image.stem for image in images}
    rows = [
        row
        for name in SETS
        for row in load_rows(name, ctc=True)
        if not (row.set == "sroie" and row.doc in held)
    ]
    with contextlib.redirect_stdout(sys.stderr):  # the fit's report, apart from the bench's
        train(rows, out)
    return out


def receipt_boxes(path: Path) -> list[tuple[Box, str]]:
    """A receipt's transcript boxes with their lines as audited (bench/label_audit.py), the
    labels the scorer's thresholds were chosen on."""
    return [
        (box, audited("sroie", path.stem, str(n), text))
        for box, text, n in receipt_lines(path.stem)
    ]


def receipt_truth(path: Path) -> str:
    lines = [text for _, text in receipt_boxes(path)]
    return canonical("\n".join(lines), case_sensitive=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--olmocr", type=int, default=None, help="first N PDFs (default all)")
    parser.add_argument("--receipts", type=int, default=20)
    parser.add_argument(
        "--held-out",
        action="store_true",
        help="receipts scored with weights fitted without them (needs the realrows cache)",
    )
    parser.add_argument("--show", type=int, default=10, help="wrong accepted texts per set")
    parser.add_argument("--sets", default="unlv,olmocr,sroie,examples", help="comma list")
    parser.add_argument(
        "--shortcuts", action="store_true", help="what the scorer's shortcuts cost (in process)"
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="with --shortcuts: each region flagged on its score, with the CTC readers' doubts",
    )
    args = parser.parse_args()
    chosen = set(args.sets.split(","))
    unlv = sorted((REALDOCS / "tesseract_test").glob("*.tif"))
    pdfs = sorted((REALDOCS / "olmocr_bench_sample" / "pdfs").rglob("*.pdf"))[: args.olmocr]
    sroie = receipts(args.receipts)
    sets = {
        "unlv": (
            unlv,
            {p.name: canonical(p.with_suffix(".txt").read_text(encoding="utf-8")) for p in unlv},
            True,
        ),
        "olmocr": (pdfs, {}, True),
        "sroie": (sroie, {p.name: receipt_truth(p) for p in sroie}, False),
    }
    if args.shortcuts:
        examples = sorted(p for p in (REPO / "examples").iterdir() if p.suffix in EXAMPLE_TYPES)
        sets["examples"] = (
            examples,
            {p.name: canonical(Path(f"{p}.gt.txt").read_text(encoding="utf-8")) for p in examples},
            True,
        )
        for name, (files, truth_of, case_sensitive) in sets.items():
            if name not in chosen or not files:
                continue
            counts = shortcuts(files, truth_of, case_sensitive, args.explain)
            line = (
                f"{name}: documents {len(files)}, regions {counts.regions}, flagged "
                f"{counts.flagged}, sent to review by a "
                f"shortcut {sum(counts.by_reason.values())} {counts.by_reason}, accepted by the "
                f"full score {counts.full_accepts}"
            )
            if counts.judged:
                line += f", right {counts.right} of {counts.judged}"
            print(line, flush=True)
            for example in counts.examples[: args.show]:
                print(f"  {example}")
            for line in counts.explained:
                print(f"  flagged: {line}")
        return
    reasons: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (files, truth_of, case_sensitive) in sets.items():
            if name not in chosen:
                continue
            if not files:
                print(f"{name}: no inputs")
                continue
            extra_env = None
            if name == "sroie" and args.held_out:
                weights = held_out_weights(files, Path(tmp) / "held_out_weights.json")
                extra_env = {"OCRFLEET_CONSENSUS_WEIGHTS_PATH": str(weights)}
            url, rows = run_cli(files, Path(tmp) / name, extra_env)
            counts = Tally()
            boxes_of = {p.name: receipt_boxes(p) for p in files} if name == "sroie" else None
            tally(url, rows, truth_of, counts, case_sensitive=case_sensitive, boxes_of=boxes_of)
            with session_scope(url) as session:
                for reason, n in session.execute(
                    select(models.ReviewFlag.reason, func.count()).group_by(
                        models.ReviewFlag.reason
                    )
                ).all():
                    reasons[f"{name}:{reason}"] = n
            dispose_engines()
            share = counts.flagged / counts.regions if counts.regions else 0.0
            line = (
                f"{name}: documents {len(rows)}, regions {counts.regions}, flagged "
                f"{counts.flagged} (share {share:.3f}, target <= {TARGETS[name]:.2f}"
                f"{', held out' if name == 'sroie' and args.held_out else ''}), "
                f"accepted {counts.accepted}, accepted empty over lines {counts.empty}"
            )
            if counts.judged:
                wrong = counts.wrong / counts.judged
                line += f", accepted wrong {counts.wrong} of {counts.judged} ({wrong:.3f})"
            print(line + f", figures {counts.figures}", flush=True)
            for example in counts.examples[: args.show]:
                print(f"  accepted, not in the truth: {example}")
        if "examples" in chosen:
            _, rows = run_cli([REPO / "examples"], Path(tmp) / "examples")
            regions = sum(row["regions"] for row in rows)
            waiting = sum(row["awaiting_review"] for row in rows)
            print(
                f"examples: documents {len(rows)}, regions {regions}, flagged {waiting} "
                "(target <= 2)"
            )
    print(f"flag reasons: {dict(sorted(reasons.items()))}")


if __name__ == "__main__":
    main()
