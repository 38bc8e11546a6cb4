"""How well the consensus scorer separates usable from wrong engine output on real documents:
`python bench/scorer_auroc.py`.

Rows: bench/realrows.py (SROIE receipts, UW3 book lines, UNLV zones), every crop read by
RapidOCR and tesseract; candidates are those real readings (the confidence-less
augmentation of training is left out here), labelled by `ocrfleet.labels.same_text`
(case-insensitive on SROIE). Every number is out of sample:

- `auroc consensus <set>`: grouped 5-fold cross-validation by document over all sets (the
  same folds as training), scored on that set's candidates;
- `auroc baseline-agreement <set>`: the edit similarity to the independent re-read alone;
  `best single feature <set>`: the best AUROC any one feature reaches (either direction);
- `auroc consensus domain-out <train>-><test>`: fitted on receipts only and scored on the
  book lines and zones, and the reverse;
- at the shipped thresholds (the weights file's, chosen on these out-of-fold scores), per
  set and engine: accept rate, precision and its Clopper-Pearson 95% lower bound; the
  same with the screen (`ConsensusScorer.score_against`: a candidate the screen's
  out-of-fold log-odds put under its engine's cut is not re-read and not accepted), with
  the share it screens out; and a split-half check where thresholds are chosen on half
  the documents and applied to the other half.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.train_consensus import (  # noqa: E402
    AUGMENTED,
    ENGINES,
    PRECISION,
    SETS,
    accepted_at,
    fit_trees,
    fold_of,
    load_examples,
    out_of_fold,
    raw_scores,
)
from ocrfleet.scorers.consensus import WEIGHTS_PATH, load_calibration  # noqa: E402
from ocrfleet.scorers.features import FEATURE_NAMES  # noqa: E402
from ocrfleet.thresholds import auroc, choose_threshold, clopper_pearson  # noqa: E402

DOMAINS = {"receipts": ("sroie",), "books": ("uw3", "unlv")}


def accept_line(label: str, y: np.ndarray, accepted: np.ndarray) -> str:
    n, k = int(accepted.sum()), int(y[accepted].sum())
    if n == 0:
        return f"{label}: accept_rate 0.000 (0/{len(y)})"
    lower = clopper_pearson(k, n)[0]
    return (
        f"{label}: accept_rate {n / len(y):.3f} ({n}/{len(y)}), precision {k / n:.4f} "
        f"(95% lower bound {lower:.4f})"
    )


def main() -> None:
    ex, x, ok = load_examples(SETS)
    y = np.array(ex.labels, dtype=bool)
    sets = np.array(ex.sets)
    engines = np.array([u.engine for u in ex.units])
    docs = np.array(ex.docs)
    real = ok & (engines != AUGMENTED)
    raw = np.zeros(len(y))
    raw[ok] = out_of_fold(x[ok], y[ok], docs[ok].tolist())
    calibration = load_calibration(WEIGHTS_PATH)
    prob = calibration.calibration(raw)
    sim = x[:, FEATURE_NAMES.index("reread_max_sim")]
    print(f"# weights {WEIGHTS_PATH.name} sha256 {calibration.sha256[:12]}")
    for name in SETS:
        m = real & (sets == name)
        print(
            f"# {name}: {int(m.sum())} candidates on {len(set(docs[m]))} documents, "
            f"{int(y[m].sum())} usable"
        )
        consensus = auroc(y[m].tolist(), raw[m].tolist())
        print(f"auroc consensus {name}: {consensus:.3f}")
        print(f"auroc baseline-agreement {name}: {auroc(y[m].tolist(), sim[m].tolist()):.3f}")
        singles = []
        for j, feature in enumerate(FEATURE_NAMES):
            if np.ptp(x[m, j]) == 0:
                continue
            a = auroc(y[m].tolist(), x[m, j].tolist())
            singles.append((max(a, 1 - a), feature))
        best, feature = max(singles)
        print(f"best single feature {name}: {best:.3f} ({feature})")
        for engine in ENGINES:
            e = m & (engines == engine)
            print(f"auroc consensus {name}[{engine}]: {auroc(y[e].tolist(), raw[e].tolist()):.3f}")
    m = ok & (engines == AUGMENTED)
    print(f"auroc consensus augmented-no-confidence: {auroc(y[m].tolist(), raw[m].tolist()):.3f}")

    for train_name, train_sets in DOMAINS.items():
        for test_name, test_sets in DOMAINS.items():
            if test_name == train_name:
                continue
            fit = ok & np.isin(sets, train_sets)
            test = real & np.isin(sets, test_sets)
            model = fit_trees(x[fit], y[fit])
            value = auroc(y[test].tolist(), raw_scores(model, x[test]).tolist())
            base = auroc(y[test].tolist(), sim[test].tolist())
            print(f"auroc consensus domain-out {train_name}->{test_name}: {value:.3f}")
            print(f"auroc baseline-agreement domain-out {train_name}->{test_name}: {base:.3f}")

    print("# at the shipped thresholds (out-of-fold scores)")
    accepted = np.zeros(len(y), dtype=bool)
    accepted[ok] = accepted_at(prob[ok], engines[ok].tolist(), calibration.thresholds)
    for name in SETS:
        for engine in ENGINES:
            m = real & (sets == name) & (engines == engine)
            threshold = calibration.threshold(engine, "text")
            if threshold is None:
                print(f"at shipped threshold {name}[{engine}]: uncalibrated")
                continue
            print(accept_line(f"at shipped threshold {name}[{engine}]", y[m], prob[m] >= threshold))
        m = real & (sets == name)
        print(accept_line(f"at shipped thresholds {name}", y[m], accepted[m]))

    print("# with the screen: no re-read and no acceptance under the cut (out-of-fold)")
    _, x0, _ = load_examples(SETS, unread=True)
    odds = np.full(len(y), np.inf)
    odds[ok] = out_of_fold(x0[ok], accepted[ok], docs[ok].tolist())
    screened = odds < np.array([calibration.screen_cut(e) for e in engines])
    for name in SETS:
        for engine in ENGINES:
            m = real & (sets == name) & (engines == engine)
            n, k = int(m.sum()), int(screened[m].sum())
            print(f"screened {name}[{engine}]: {k / n:.3f} ({k}/{n})")
        m = real & (sets == name)
        print(
            accept_line(
                f"at shipped thresholds with the screen {name}", y[m], (accepted & ~screened)[m]
            )
        )

    print("# split-half: thresholds chosen on one half of the documents, applied to the other")
    half = np.array([fold_of(doc, 2) for doc in docs])
    for chosen_on in (0, 1):
        for engine in ENGINES:
            pick = real & (half == chosen_on) & (engines == engine)
            choice = choose_threshold(y[pick].tolist(), prob[pick].tolist(), PRECISION)
            for name in SETS:
                m = real & (half != chosen_on) & (sets == name) & (engines == engine)
                if choice is None:
                    print(f"split-half {chosen_on} {name}[{engine}]: no threshold")
                    continue
                print(
                    accept_line(
                        f"split-half {chosen_on} {name}[{engine}] t={choice.threshold:.4f}",
                        y[m],
                        prob[m] >= choice.threshold,
                    )
                )


if __name__ == "__main__":
    main()
