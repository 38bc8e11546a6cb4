"""How well the consensus scorer separates right from wrong engine output:
`python bench/scorer_auroc.py`.

Sets: (a) held-out synthetic lines (seed 1; training used seed 0), (b) real lines (UW3 +
UNLV zones, see bench/reallines.py; never used in training). Every candidate is a real
engine's output (RapidOCR and tesseract) on the line crop; its label is exact equality with
the ground truth after whitespace folding. A unit the scorer could not score counts as
the lowest score (it goes to review). Baselines: each engine's own confidence, on that
engine's candidates.

Prints `auroc <scorer> <set>: X.XXX`, and for the consensus scorer the highest auto-accept
rate whose accepted text is still >= 99% exact (threshold chosen on that same set, so an
upper bound), plus what the threshold chosen on the synthetic set gives on the real set.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.reallines import real_lines  # noqa: E402
from bench.synthetic import synthetic_lines  # noqa: E402
from bench.train_consensus import CACHE, HELDOUT_SEED, ReadCache, same_text  # noqa: E402
from ocrfleet import ir  # noqa: E402
from ocrfleet.config import Settings  # noqa: E402
from ocrfleet.engines.base import Recogniser  # noqa: E402
from ocrfleet.scorers.base import Unit  # noqa: E402
from ocrfleet.scorers.consensus import ConsensusScorer  # noqa: E402
from ocrfleet.thresholds import auroc, best_accept_rate, threshold_table  # noqa: E402

N_HELDOUT = 600
PRECISION = 0.99
REPORTED_THRESHOLDS = (0.5, 0.9, 0.99, 0.998)  # 0.5 is the settings' default threshold


@dataclass(frozen=True)
class Candidates:
    """Every engine's reading of every line of a set, with labels and scores."""

    units: list[Unit]
    labels: list[bool]
    truths: list[str]
    scores: list[ir.Score]

    def consensus(self, engine: str | None = None) -> tuple[list[bool], list[float | None]]:
        pairs = [
            (label, score.score if score.verdict == ir.Verdict.scored else None)
            for unit, label, score in zip(self.units, self.labels, self.scores, strict=True)
            if engine is None or unit.engine == engine
        ]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def confidence(self, engine: str) -> tuple[list[bool], list[float | None]]:
        pairs = [
            (label, unit.confidence)
            for unit, label in zip(self.units, self.labels, strict=True)
            if unit.engine == engine
        ]
        return [p[0] for p in pairs], [p[1] for p in pairs]


def read_and_score(
    images: Sequence, truths: Sequence[str], readers: Sequence[Recogniser], read, scorer
) -> Candidates:
    """Each reader reads every image (one batch per reader); all candidates are scored in
    one batch, region number = line number, so candidates of a line share one crop."""
    readings = {reader.name: read(reader, list(images)) for reader in readers}
    units, labels, unit_truths = [], [], []
    for n, (image, truth) in enumerate(zip(images, truths, strict=True)):
        for reader in readers:
            if readings[reader.name][n] is None:  # the engine failed: no candidate
                continue
            text, confidence = readings[reader.name][n]
            units.append(Unit(image, text, ir.Category.text, n + 1, reader.name, confidence))
            labels.append(same_text(text, truth))
            unit_truths.append(truth)
    return Candidates(units, labels, unit_truths, scorer.score(units))


def load_sets(settings: Settings, readers: Sequence[Recogniser], scorer) -> dict[str, Candidates]:
    from ocrfleet.engines import load_detector

    cache = ReadCache(CACHE / "reads.json")
    synthetic = synthetic_lines(N_HELDOUT, HELDOUT_SEED)
    real = real_lines(load_detector(settings), readers, cache.read)
    return {
        "synthetic": read_and_score(
            [line.image for line in synthetic],
            [line.truth for line in synthetic],
            readers,
            cache.read,
            scorer,
        ),
        "real": read_and_score(
            [line.image for line in real],
            [line.truth for line in real],
            readers,
            cache.read,
            scorer,
        ),
    }


def report(sets: dict[str, Candidates], readers: Sequence[Recogniser]) -> None:
    for set_name, data in sets.items():
        labels, scores = data.consensus()
        print(
            f"# {set_name}: {len(labels)} candidates on {len(labels) // len(readers)} lines, "
            f"{sum(labels)} exact; not scored: {sum(s is None for s in scores)}"
        )
        print(f"auroc consensus {set_name}: {auroc(labels, scores):.3f}")
        for reader in readers:
            print(
                f"auroc {reader.name}_conf {set_name}: {auroc(*data.confidence(reader.name)):.3f}"
            )
        for reader in readers:
            print(
                f"auroc consensus[{reader.name}] {set_name}: "
                f"{auroc(*data.consensus(reader.name)):.3f}"
            )
        row = best_accept_rate(labels, scores, PRECISION)
        if row is None:
            print(f"accept_rate@{PRECISION:.0%}precision consensus {set_name}: 0.000 (none)")
        else:
            print(
                f"accept_rate@{PRECISION:.0%}precision consensus {set_name}: {row.accept_rate:.3f} "
                f"(threshold {row.threshold:.4f}, accepted {row.n_accepted}/{len(labels)}, "
                f"precision {row.precision:.4f})"
            )
        for reader in readers:
            row = best_accept_rate(*data.confidence(reader.name), PRECISION)
            rate = 0.0 if row is None else row.accept_rate
            print(
                f"accept_rate@{PRECISION:.0%}precision {reader.name}_conf[{reader.name}] "
                f"{set_name}: {rate:.3f}"
            )
        for row in threshold_table(labels, scores, REPORTED_THRESHOLDS):
            precision = "n/a" if row.precision is None else f"{row.precision:.4f}"
            print(
                f"at threshold {row.threshold:.3f} consensus {set_name}: "
                f"accept_rate {row.accept_rate:.3f}, precision {precision}"
            )
    if "synthetic" in sets and "real" in sets:
        chosen = best_accept_rate(*sets["synthetic"].consensus(), PRECISION)
        if chosen is not None:
            (row,) = threshold_table(*sets["real"].consensus(), [chosen.threshold])
            precision = "n/a" if row.precision is None else f"{row.precision:.4f}"
            print(
                f"transfer: threshold {chosen.threshold:.4f} from synthetic gives on real "
                f"accept_rate {row.accept_rate:.3f}, precision {precision}"
            )


def main() -> None:
    from ocrfleet.scorers import second_readers

    settings = Settings()
    readers = second_readers(settings)
    scorer = ConsensusScorer(settings, readers)
    print(f"scorer {scorer.version}")
    report(load_sets(settings, readers, scorer), readers)


if __name__ == "__main__":
    main()
