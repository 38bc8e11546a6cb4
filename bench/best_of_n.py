"""Does choosing among engines by the consensus score beat each engine alone?
`python bench/best_of_n.py`.

On the real lines of bench/reallines.py (UW3 + UNLV zones), every line is read by RapidOCR
and by tesseract; both candidates are scored by the consensus scorer on the same crop in one
batch, and best-of-N takes the highest `scored` candidate (ties to the first engine; when
neither is scored, the first engine's text, as the review policy does). Prints the CER
(total edit distance / total ground-truth characters, whitespace folded) of each engine
alone, of best-of-N, and of an oracle that always picks the better candidate (the bound).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.reallines import real_lines  # noqa: E402
from bench.scorer_auroc import Candidates, read_and_score  # noqa: E402
from bench.train_consensus import CACHE, ReadCache  # noqa: E402
from ocrfleet import ir  # noqa: E402
from ocrfleet.config import Settings  # noqa: E402
from ocrfleet.metrics import levenshtein, normalize_ws  # noqa: E402
from ocrfleet.scorers.consensus import ConsensusScorer  # noqa: E402


def choices(data: Candidates, engines: list[str]) -> dict[str, dict[int, str]]:
    """Text per line (region number) for each engine alone, best-of-N and the oracle."""
    by_line: dict[int, dict[str, tuple[str, float | None]]] = {}
    truth: dict[int, str] = {}
    for unit, score, line_truth in zip(data.units, data.scores, data.truths, strict=True):
        value = score.score if score.verdict == ir.Verdict.scored else None
        by_line.setdefault(unit.region_number, {})[unit.engine] = (unit.text, value)
        truth[unit.region_number] = line_truth
    out: dict[str, dict[int, str]] = {name: {} for name in [*engines, "best_of_n", "oracle"]}
    for line, candidates in by_line.items():
        for engine in engines:
            out[engine][line] = candidates.get(engine, ("", None))[0]
        ordered = [(engine, *candidates[engine]) for engine in engines if engine in candidates]
        scored = [item for item in ordered if item[2] is not None]
        if scored:
            out["best_of_n"][line] = max(scored, key=lambda item: item[2])[1]
        else:
            out["best_of_n"][line] = ordered[0][1] if ordered else ""
        out["oracle"][line] = min(
            (item[1] for item in ordered),
            key=lambda text: levenshtein(normalize_ws(text), truth[line]),
            default="",
        )
    out["_truth"] = truth
    return out


def corpus_cer(hypotheses: dict[int, str], truths: dict[int, str]) -> float:
    errors = sum(levenshtein(normalize_ws(hypotheses[k]), truths[k]) for k in truths)
    return errors / sum(len(truths[k]) for k in truths)


def main() -> None:
    from ocrfleet.engines import load_detector
    from ocrfleet.scorers import second_readers

    settings = Settings()
    readers = second_readers(settings)
    scorer = ConsensusScorer(settings, readers)
    cache = ReadCache(CACHE / "reads.json")
    lines = real_lines(load_detector(settings), readers, cache.read)
    data = read_and_score(
        [line.image for line in lines], [line.truth for line in lines], readers, cache.read, scorer
    )
    engines = [reader.name for reader in readers]
    picked = choices(data, engines)
    truths = picked.pop("_truth")
    print(f"# real: {len(truths)} lines, {sum(len(t) for t in truths.values())} characters")
    for name in [*engines, "best_of_n", "oracle"]:
        exact = sum(normalize_ws(picked[name][k]) == truths[k] for k in truths)
        print(
            f"cer {name} real: {corpus_cer(picked[name], truths):.5f} "
            f"(exact lines {exact}/{len(truths)})"
        )


if __name__ == "__main__":
    main()
