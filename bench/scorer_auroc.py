"""How well the consensus scorer separates usable from wrong engine output on real documents:
`python bench/scorer_auroc.py`.

Rows: bench/realrows.py (SROIE receipts, UW3 book lines, UNLV zones, PDF text-layer lines),
every crop read by RapidOCR, tesseract and EasyOCR, with the CTC models' evidence;
candidates are those real readings (the confidence-less augmentation of training is left out
here), labelled by `ocrfleet.labels.same_text` on the audited labels (case-insensitive on
SROIE). Every number is out of sample:

- `auroc consensus <set>`: grouped 5-fold cross-validation by document over all sets (the
  same folds as training), scored on that set's candidates;
- `auroc baseline-agreement <set>`: the edit similarity to the independent re-read alone;
  `best single feature <set>`: the best AUROC any one feature reaches (either direction);
- `auroc consensus domain-out <train>-><test>`: fitted on one domain only (receipts; book
  lines and zones; PDF text-layer lines) and scored on each other, beside the best single
  feature on the test side;
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
from ocrfleet.scorers.features import CTC_MODELS, FEATURE_NAMES, READERS  # noqa: E402
from ocrfleet.thresholds import auroc, choose_threshold, clopper_pearson  # noqa: E402

DOMAINS = {"receipts": ("sroie",), "books": ("uw3", "unlv"), "pdfs": ("pdf",)}
RULE_FLOORS = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98)


def best_single(y: np.ndarray, x: np.ndarray) -> tuple[float, str]:
    """The best AUROC any one feature reaches on these rows (either direction)."""
    singles = []
    for j, feature in enumerate(FEATURE_NAMES):
        if np.ptp(x[:, j]) == 0:
            continue
        a = auroc(y.tolist(), x[:, j].tolist())
        singles.append((max(a, 1 - a), feature))
    return max(singles)


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
        best, feature = best_single(y[m], x[m])
        print(f"best single feature {name}: {best:.3f} ({feature})")
        for engine in ENGINES:
            e = m & (engines == engine)
            print(f"auroc consensus {name}[{engine}]: {auroc(y[e].tolist(), raw[e].tolist()):.3f}")
    for domain, members in DOMAINS.items():
        m = real & np.isin(sets, members)
        best, feature = best_single(y[m], x[m])
        print(f"auroc consensus {domain}: {auroc(y[m].tolist(), raw[m].tolist()):.3f}")
        print(f"best single feature {domain}: {best:.3f} ({feature})")
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
            best, feature = best_single(y[test], x[test])
            print(f"auroc consensus domain-out {train_name}->{test_name}: {value:.3f}")
            print(f"auroc baseline-agreement domain-out {train_name}->{test_name}: {base:.3f}")
            print(f"best single feature {test_name}: {best:.3f} ({feature})")

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
    for domain, members in DOMAINS.items():
        m = real & np.isin(sets, members)
        print(accept_line(f"at shipped thresholds {domain}", y[m], accepted[m]))
        m &= engines == ENGINES[0]
        print(accept_line(f"at shipped thresholds {domain}[{ENGINES[0]}]", y[m], accepted[m]))

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

    agreement_rule(ex, x, y, real, sets)
    shortcuts(ex, x, y, real, sets, engines, accepted)

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


def agreement_rule(ex, x: np.ndarray, y: np.ndarray, real: np.ndarray, sets: np.ndarray) -> None:
    """>= 2 engines read the candidate's text exactly, and every other CTC model's weakest
    character reaches the floor: the floor chosen on one domain (the lowest whose lower
    bound is >= PRECISION there), judged on the other."""
    col = FEATURE_NAMES.index
    exact = sum(x[:, col(f"{reader}_exact")] for reader in READERS)
    weakest = np.full(len(y), np.inf)
    for model in CTC_MODELS:
        present = x[:, col(f"ctc_{model}_missing")] == 0
        value = x[:, col(f"ctc_{model}_min_prob")]
        weakest = np.where(present, np.minimum(weakest, value), weakest)
    agree = real & (exact >= 1)
    print("# agreement rule: >= 2 engines agree exactly, weakest CTC character >= floor")
    for floor in RULE_FLOORS:
        for domain, members in DOMAINS.items():
            m = real & np.isin(sets, members)
            rule = agree & (weakest >= floor)
            print(accept_line(f"agreement rule floor {floor} {domain}", y[m], rule[m]))
    for chosen_on, members in DOMAINS.items():
        m = real & np.isin(sets, members)
        floor = next(
            (
                f
                for f in RULE_FLOORS
                if (n := int((agree & (weakest >= f) & m).sum()))
                and clopper_pearson(int(y[agree & (weakest >= f) & m].sum()), n)[0] >= PRECISION
            ),
            None,
        )
        for domain, other in DOMAINS.items():
            if domain == chosen_on:
                continue
            if floor is None:
                print(f"agreement rule chosen on {chosen_on}: no floor keeps {PRECISION}")
                continue
            t = real & np.isin(sets, other)
            label = f"agreement rule floor {floor} chosen on {chosen_on} -> {domain}"
            print(accept_line(label, y[t], (agree & (weakest >= floor))[t]))


def shortcuts(
    ex,
    x: np.ndarray,
    y: np.ndarray,
    real: np.ndarray,
    sets: np.ndarray,
    engines: np.ndarray,
    accepted_oof: np.ndarray,
) -> None:
    """`score_against`'s stages on every real candidate as its region's sole candidate,
    with the shipped model: what each skips, and the accepted candidates it loses or gains
    against the full score (the bounds are exact, so only the early accept's, the screen's
    and the second stage's predictions can change any). In-sample for the shipped trees:
    the weights file holds the out-of-fold figures."""
    from ocrfleet.scorers.consensus import LAZY_READERS
    from ocrfleet.scorers.features import optimistic, pessimistic, rereads_for

    calibration = load_calibration(WEIGHTS_PATH)
    _, x0, _ = load_examples(SETS, unread=True)
    _, x1, _ = load_examples(SETS, lazy=LAZY_READERS)
    trees, platt = calibration.trees, calibration.calibration
    full = platt(trees.raw(x))
    print("# shortcuts of score_against (shipped model, every real candidate alone)")
    for name in SETS:
        for engine in ENGINES:
            m = np.flatnonzero(real & (sets == name) & (engines == engine))
            limit = calibration.threshold(engine, "text")
            if limit is None or not m.size:
                continue
            rows, free = zip(*(optimistic(x0[i], engine) for i in m), strict=True)
            upper = platt(trees.upper_raw(np.vstack(rows), np.vstack(free)))
            right0 = calibration.early_calibration(calibration.early.raw(x0[m]))
            early0 = right0 >= max(calibration.early_threshold(engine), limit)
            screen = ~early0 & (calibration.screen.raw(x0[m]) < calibration.screen_cut(engine))
            bounded = ~early0 & (upper < limit)
            stage1 = early0 | bounded | screen
            pending = [r for r in rereads_for(engine) if r in LAZY_READERS]
            lazy_up = np.full(m.size, np.inf)
            lazy_low = np.full(m.size, -np.inf)
            if pending:
                rows, free = zip(*(optimistic(x1[i], engine, pending) for i in m), strict=True)
                lazy_up = platt(trees.upper_raw(np.vstack(rows), np.vstack(free)))
                rows, free = zip(*(pessimistic(x1[i], engine, pending) for i in m), strict=True)
                lazy_low = platt(trees.lower_raw(np.vstack(rows), np.vstack(free)))
            exact2 = ~stage1 & ((lazy_up < limit) | (lazy_low >= limit))
            early, cut = calibration.second_stage(engine)
            raw2 = calibration.second.raw(x1[m])
            predicted = calibration.second_calibration(raw2)
            early_accept = ~stage1 & ~exact2 & bool(pending) & (predicted >= max(early, limit))
            early_review = ~stage1 & ~exact2 & bool(pending) & ~early_accept & (raw2 < cut)
            stage2 = exact2 | early_accept | early_review
            third = ~stage1 & ~stage2 & bool(pending)
            accept_full = full[m] >= limit
            accept_path = early0 | (
                ~stage1
                & ~early_review
                & (early_accept | np.where(exact2, lazy_low >= limit, accept_full))
            )
            lost = int((accept_full & ~accept_path).sum())
            gained = accept_path & ~accept_full
            print(
                f"shortcuts {name}[{engine}]: {m.size} candidates, accepted before any re-read "
                f"{int(early0.sum())}, bounded {int(bounded.sum())}, "
                f"screened {int((screen & ~bounded).sum())}, decided without {pending} "
                f"{int(stage2.sum())} (exact {int(exact2.sum())}, predicted right "
                f"{int(early_accept.sum())}, predicted not accepted {int(early_review.sum())}), "
                f"read by {pending} {int(third.sum())} ({third.mean():.3f}); accepted full "
                f"{int(accept_full.sum())} (wrong {int((accept_full & ~y[m]).sum())}), by the "
                f"path {int(accept_path.sum())} (wrong {int((accept_path & ~y[m]).sum())}), "
                f"lost {lost} (wrong among lost {int((accept_full & ~accept_path & ~y[m]).sum())}),"
                f" gained {int(gained.sum())} (wrong {int((gained & ~y[m]).sum())})"
            )


if __name__ == "__main__":
    main()
