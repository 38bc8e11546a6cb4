"""Does choosing among engines by the consensus score beat each engine alone?
`python bench/best_of_n.py`.

On the real rows of bench/realrows.py (SROIE receipts, UW3 book lines, UNLV zones), every
crop is read by RapidOCR (the primary engine, first in OCRFLEET_ENGINES), tesseract and
EasyOCR; the three candidates are scored out of fold (grouped 5-fold cross-validation by
document, as in training) and best-of-N follows the review policy: the primary's candidate
unless another's score beats it by more than the shipped margin. Prints, per set, the CER (total
edit distance / total ground-truth characters, labels' canonical form: NFKC, typographic
quotes and dashes folded, whitespace folded; case-insensitive on SROIE) of each engine
alone, of best-of-N and of an oracle that always picks the better candidate, with the
switch rate and how many switches fixed or broke a line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.train_consensus import (  # noqa: E402
    ENGINES,
    SETS,
    best_of_n_lines,
    load_examples,
    out_of_fold,
    pick,
)
from ocrfleet.labels import canonical  # noqa: E402
from ocrfleet.metrics import levenshtein  # noqa: E402
from ocrfleet.scorers.consensus import WEIGHTS_PATH, load_calibration  # noqa: E402


def main() -> None:
    ex, x, ok = load_examples(SETS)
    y = np.array(ex.labels, dtype=bool)
    raw = np.zeros(len(y))
    raw[ok] = out_of_fold(x[ok], y[ok], np.array(ex.docs)[ok].tolist())
    calibration = load_calibration(WEIGHTS_PATH)
    prob = calibration.calibration(raw)
    margin = calibration.margin
    truth = dict(zip(ex.rows, ex.truths, strict=True))
    case = dict(zip(ex.rows, ex.case_sensitive, strict=True))
    sets = np.array(ex.sets)
    print(f"# best-of-N margin {margin} (weights sha256 {calibration.sha256[:12]})")
    for name in SETS:
        lines = best_of_n_lines(prob, ex, ok & (sets == name))
        lines = {r: c for r, c in lines.items() if len(c) == len(ENGINES)}

        def distance(text: str, row: str) -> int:
            return levenshtein(
                canonical(text, case_sensitive=case[row]),
                canonical(truth[row], case_sensitive=case[row]),
            )

        chars = sum(len(canonical(truth[r], case_sensitive=case[r])) for r in lines)
        print(f"# {name}: {len(lines)} lines, {chars} characters")
        for engine in ENGINES:
            errors = sum(distance(c[engine][0], r) for r, c in lines.items())
            print(f"cer {engine} {name}: {errors / chars:.5f}")
        errors = switches = fixed = broken = 0
        for row, candidates in lines.items():
            engine, text = pick(candidates, margin)
            errors += distance(text, row)
            if engine != ENGINES[0]:
                switches += 1
                before = distance(candidates[ENGINES[0]][0], row)
                after = distance(text, row)
                fixed += after < before
                broken += after > before
        print(f"cer best_of_n {name}: {errors / chars:.5f}")
        best_single = min(
            sum(distance(c[engine][0], r) for r, c in lines.items()) for engine in ENGINES
        )
        verdict = "not above" if errors <= best_single else "ABOVE"
        print(f"best_of_n {name}: {verdict} the best single engine ({best_single / chars:.5f})")
        oracle = sum(min(distance(t, r) for t, _ in c.values()) for r, c in lines.items())
        print(f"cer oracle {name}: {oracle / chars:.5f}")
        print(
            f"switches {name}: {switches}/{len(lines)} ({switches / max(len(lines), 1):.3f}), "
            f"fixed {fixed}, broke {broken}"
        )


if __name__ == "__main__":
    main()
