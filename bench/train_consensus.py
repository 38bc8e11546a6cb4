"""Train the consensus scorer's calibration: `python bench/train_consensus.py`.

Data (synthetic only; the realdocs that `scorer_auroc.py` evaluates on are never seen):

- synthetic degraded text lines (bench/synthetic.py, seed 0) read by the real engines
  (RapidOCR and tesseract): each engine's output is a candidate, correct when it equals
  the truth after whitespace folding; these carry the engines' real confidences and real
  mistakes;
- the truth itself (correct) and rule perturbations of it (wrong: changed digits,
  look-alike characters, dropped, inserted and swapped characters, merged and split
  words, dropped words, truncation, case flips) as candidates of an engine without
  confidence, the way a MiniCPM-OCR candidate looks to the scorer;
- synthetic tables with HTML truth and broken-cell versions of it.

The fit (consensus.fit_weights) is deterministic: the same data hash gives the same weights
file byte for byte. Engine reads are cached under bench/out/cache (keyed by image bytes and
engine version), so a rerun costs only the feature computation.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.synthetic import SynthLine, perturb, synthetic_lines, synthetic_tables  # noqa: E402
from ocrfleet import ir  # noqa: E402
from ocrfleet.config import Settings  # noqa: E402
from ocrfleet.engines.base import Recogniser  # noqa: E402
from ocrfleet.metrics import normalize_ws  # noqa: E402
from ocrfleet.scorers.base import Unit  # noqa: E402
from ocrfleet.scorers.consensus import (  # noqa: E402
    WEIGHTS_PATH,
    ConsensusFeatures,
    Failure,
    fit_weights,
)

CACHE = ROOT / "bench" / "out" / "cache"
SYNTHETIC_ENGINE = "synthetic"  # candidates without an engine confidence
TRAIN_SEED = 0
HELDOUT_SEED = 1  # scorer_auroc.py's held-out synthetic set
N_LINES = 2400
N_TABLES = 150
PERTURBATIONS_PER_LINE = 1
HELPER = "helper"  # a unit that supplies a second read and is not trained on
L2 = 1.0


@dataclass(frozen=True)
class Example:
    unit: Unit
    label: bool
    kind: str  # "engine", "truth", a perturbation rule, "table", "broken_table", HELPER


class ReadCache:
    """Engine readings by (engine version, image bytes): reading is the slow part."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.data: dict[str, list] = {}
        if path is not None and path.is_file():
            self.data = json.loads(path.read_text(encoding="utf-8"))

    @staticmethod
    def key(reader: Recogniser, image: Image.Image) -> str:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", compress_level=1)
        return hashlib.sha256(
            f"{reader.name}@{reader.version}".encode() + buffer.getvalue()
        ).hexdigest()

    def read(
        self, reader: Recogniser, images: Sequence[Image.Image]
    ) -> list[tuple[str, float | None] | None]:
        """Each image's reading, None where the engine failed on it."""
        keys = [self.key(reader, image) for image in images]
        missing = [i for i, key in enumerate(keys) if key not in self.data]
        if missing:
            try:
                outputs = reader.recognise([images[i] for i in missing])
            except Exception:  # noqa: BLE001 - find the image that fails, read the rest
                outputs = [self._read_one(reader, images[i]) for i in missing]
            for i, output in zip(missing, outputs, strict=True):
                self.data[keys[i]] = None if output is None else [output[0], output[1]]
            self.save()
        return [None if self.data[k] is None else (self.data[k][0], self.data[k][1]) for k in keys]

    @staticmethod
    def _read_one(reader: Recogniser, image: Image.Image) -> tuple[str, float | None] | None:
        try:
            ((text, confidence),) = reader.recognise([image])
        except Exception as error:  # noqa: BLE001 - recorded as a failed read
            print(f"{reader.name} cannot read a {image.size} image: {error}", file=sys.stderr)
            return None
        return text, confidence

    def save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.data, sort_keys=True), encoding="utf-8")


def same_text(candidate: str, truth: str) -> bool:
    """The label: exactly the truth after whitespace folding."""
    return normalize_ws(candidate) == normalize_ws(truth)


def line_examples(
    lines: Sequence[SynthLine],
    readers: Sequence[Recogniser],
    cache: ReadCache,
    seed: int,
    perturbations: int = PERTURBATIONS_PER_LINE,
) -> list[Example]:
    """Engine candidates, the truth and perturbations of it, for every line."""
    rng = random.Random(seed)
    images = [line.image for line in lines]
    reads = {reader.name: cache.read(reader, images) for reader in readers}
    examples = []
    for n, line in enumerate(lines):

        def unit(text: str, engine: str, confidence: float | None, line=line, n=n) -> Unit:
            return Unit(line.image, text, line.category, n + 1, engine, confidence)

        for reader in readers:
            if reads[reader.name][n] is None:
                continue
            text, confidence = reads[reader.name][n]
            examples.append(
                Example(unit(text, reader.name, confidence), same_text(text, line.truth), "engine")
            )
        examples.append(Example(unit(line.truth, SYNTHETIC_ENGINE, None), True, "truth"))
        for _ in range(perturbations):
            changed = perturb(line.truth, rng)
            if changed is not None:
                rule, text = changed
                examples.append(Example(unit(text, SYNTHETIC_ENGINE, None), False, rule))
    return examples


def table_examples(
    n: int, seed: int, readers: Sequence[Recogniser], cache: ReadCache
) -> list[Example]:
    """Correct and broken-cell HTML for synthetic tables. The engines' plain-text reads of
    each table ride along as helper units: they give the second read, and are not trained
    on (a line engine's text is not a table candidate)."""
    tables = synthetic_tables(n, seed)
    reads = {
        reader.name: cache.read(reader, [table.image for table, _ in tables]) for reader in readers
    }
    examples = []
    for k, (table, broken) in enumerate(tables):
        for reader in readers:
            if reads[reader.name][k] is None:
                continue
            text, confidence = reads[reader.name][k]
            read = Unit(table.image, text, ir.Category.text, k + 1, reader.name, confidence)
            examples.append(Example(read, False, HELPER))
        good = Unit(table.image, table.truth, ir.Category.table, k + 1, SYNTHETIC_ENGINE, None)
        bad = Unit(table.image, broken, ir.Category.table, k + 1, SYNTHETIC_ENGINE, None)
        examples.append(Example(good, True, "table"))
        examples.append(Example(bad, False, "broken_table"))
    return examples


def featurize(
    examples: Sequence[Example], features: ConsensusFeatures
) -> tuple[np.ndarray, np.ndarray, list[Example], dict[str, int]]:
    """The feature matrix and labels of the examples that could be scored, and how many
    were left out by verdict (those are never scored, so they are not training data)."""
    computed = features.compute([example.unit for example in examples])
    rows, labels, kept = [], [], []
    left_out: dict[str, int] = {}
    for example, value in zip(examples, computed, strict=True):
        if example.kind == HELPER:
            continue
        if isinstance(value, Failure):
            left_out[value.verdict.value] = left_out.get(value.verdict.value, 0) + 1
            continue
        rows.append(value)
        labels.append(example.label)
        kept.append(example)
    return np.vstack(rows), np.array(labels, dtype=bool), kept, left_out


def build_training_set(
    readers: Sequence[Recogniser],
    settings: Settings,
    n_lines: int = N_LINES,
    n_tables: int = N_TABLES,
    seed: int = TRAIN_SEED,
    cache: ReadCache | None = None,
) -> tuple[np.ndarray, np.ndarray, list[Example], dict[str, int]]:
    cache = cache or ReadCache(None)
    examples = line_examples(synthetic_lines(n_lines, seed), readers, cache, seed)
    if n_tables:
        examples += table_examples(n_tables, seed + 1000, readers, cache)
    return featurize(examples, ConsensusFeatures(settings, readers))


def train(
    readers: Sequence[Recogniser],
    settings: Settings,
    n_lines: int = N_LINES,
    n_tables: int = N_TABLES,
    seed: int = TRAIN_SEED,
    cache: ReadCache | None = None,
    l2: float = L2,
) -> str:
    """The weights file's text for a synthetic training set of this size and seed."""
    x, y, _, left_out = build_training_set(readers, settings, n_lines, n_tables, seed, cache)
    return fit_weights(
        x,
        y,
        l2=l2,
        extra={
            "source": "bench/train_consensus.py: synthetic lines and tables only",
            "seed": seed,
            "n_lines": n_lines,
            "n_tables": n_tables,
            "second_readers": [f"{r.name}@{r.version}" for r in readers],
            "left_out_by_verdict": dict(sorted(left_out.items())),
        },
    )


def load_readers(settings: Settings) -> list[Recogniser]:
    """The scorer's own second readers: the same ones `load_scorer` gives it."""
    from ocrfleet.scorers import second_readers

    return second_readers(settings)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=N_LINES)
    parser.add_argument("--tables", type=int, default=N_TABLES)
    parser.add_argument("--seed", type=int, default=TRAIN_SEED)
    parser.add_argument("--l2", type=float, default=L2)
    parser.add_argument("--out", type=Path, default=WEIGHTS_PATH)
    args = parser.parse_args(argv)
    settings = Settings()
    readers = load_readers(settings)
    cache = ReadCache(CACHE / "reads.json")
    text = train(readers, settings, args.lines, args.tables, args.seed, cache, args.l2)
    args.out.write_text(text, encoding="utf-8")
    document = json.loads(text)
    print(f"wrote {args.out}")
    print(f"data_sha256 {document['training']['data_sha256']}")
    print(f"examples {document['training']['n']} correct {document['training']['n_correct']}")
    print(f"train log loss {document['training']['train_log_loss']}")
    for name, coef in sorted(
        zip(document["feature_names"], document["coef"], strict=True), key=lambda p: -abs(p[1])
    ):
        print(f"  {coef:+.3f} {name}")


if __name__ == "__main__":
    main()
