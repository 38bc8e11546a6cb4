"""Character-level evidence from CTC recognisers: what a model saw in one crop, frame by
frame, and how plausible any reading of that crop is under it.

A CTC recogniser (RapidOCR's PP-OCR, EasyOCR's CRNN) turns a crop into T frames, each a
probability distribution over its C classes (class 0 is the CTC blank). `Posterior` keeps
those per-frame log-probabilities and answers three questions:

- `text()`: the greedy reading (best class per frame, repeats merged, blanks dropped), the
  same decoding the engines use;
- `evidence()`: how sure the model is of that reading, character by character (the weakest
  character, the smallest margin to the runner-up class, the greedy path's log-likelihood
  per character): one doubtful character shows here, while a line's mean confidence hides
  it;
- `log_likelihood(text)`: log P(text | crop), the CTC forward algorithm over every alignment
  of `text` with the frames, for ANY text: another engine's reading scored under this model
  ("does PP-OCR find tesseract's reading plausible?", cross-scoring).

Characters without a column (outside the model's alphabet, or a column dropped because the
model never gave it any probability, see `prune`) get the posterior's `floor`
log-probability at every frame: such a text is very unlikely, never an error. A text
longer than the frames can emit (each character needs a frame, and a repeated character a
blank between) has likelihood -inf.

How engines hand posteriors over (see `ocrfleet.engines.rapidocr` and `.easyocr`): a CTC
recogniser has `posteriors(crops) -> list[Posterior]`, batched. It also keeps the posteriors
of the crops it has just read in `RECENT`, a small process-wide cache keyed by the model's
version and the crop's pixels (`crop_key`), so the scorer asking for the posteriors of the
crops the primary engine already read costs no second model call, even when the scorer's
reader is another instance of the same engine.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from PIL import Image

BLANK = ""  # the CTC blank's entry in a charset (column 0)
# Per-frame log-probability of a character the model has no column for (about 2e-9): far
# below any class a trained CTC model gives real weight to, finite so that likelihoods of
# texts with a foreign character still order by how much of the rest fits.
UNKNOWN_LOG_PROB = -20.0
# Columns whose probability stays under this in every frame of a crop are dropped from its
# posterior (see `prune`); they then read as `floor` = log(PRUNE_PROB), an upper bound.
PRUNE_PROB = 1e-5


@dataclass(frozen=True)
class CharEvidence:
    """How sure a CTC model is of its own greedy reading of a crop."""

    min_char_prob: float  # weakest emitted character's probability (1.0 for empty text)
    min_margin: float  # smallest top-1 minus top-2 probability over emitting frames
    mean_log_prob: float  # the greedy path's log-likelihood per emitted character


@dataclass(frozen=True, eq=False)
class Posterior:
    """One crop read by one CTC model: its per-frame log-probabilities."""

    engine: str  # "rapidocr" | "easyocr"
    log_probs: np.ndarray  # (T, C) float32 log-softmax, column 0 = CTC blank
    charset: tuple[str, ...]  # charset[i] is the character of column i (charset[0] = blank)
    # Log-probability per frame of a character with no column here (see module docstring).
    floor: float = field(default=UNKNOWN_LOG_PROB)

    def __post_init__(self) -> None:
        if self.log_probs.ndim != 2 or self.log_probs.shape[1] != len(self.charset):
            raise ValueError(
                f"log_probs of shape {self.log_probs.shape} do not match a charset of "
                f"{len(self.charset)} classes"
            )
        if not self.charset or self.charset[0] != BLANK:
            raise ValueError("charset[0] must be the CTC blank")

    @cached_property
    def _columns(self) -> dict[str, list[int]]:
        """Columns per character; a character with several columns is their sum."""
        columns: dict[str, list[int]] = {}
        for index, char in enumerate(self.charset[1:], start=1):
            columns.setdefault(char, []).append(index)
        return columns

    @cached_property
    def _best(self) -> np.ndarray:
        return self.log_probs.argmax(axis=1)

    def text(self) -> str:
        """The greedy CTC reading: the best class per frame, repeats merged, blanks dropped."""
        return "".join(self.charset[c] for c, _, _ in _runs(self._best))

    def evidence(self) -> CharEvidence:
        """Evidence on the greedy reading. Each emitted character is judged at its most
        confident frame (the frames at a character's edges share their weight with the
        blank, which is no doubt about which character it is): its probability there, and
        the margin to the runner-up class there."""
        lp = self.log_probs
        frames = np.arange(lp.shape[0])
        greedy_ll = float(lp[frames, self._best].astype(np.float64).sum())
        probs, margins = [], []
        for column, start, end in _runs(self._best):
            peak = start + int(lp[start:end, column].argmax())
            row = np.exp(lp[peak].astype(np.float64))
            top2 = np.partition(row, -2)[-2:] if row.size > 1 else np.array([0.0, row[0]])
            probs.append(float(row[column]))
            margins.append(float(top2[1] - top2[0]))
        return CharEvidence(
            min_char_prob=min(probs, default=1.0),
            min_margin=min(margins, default=1.0),
            mean_log_prob=greedy_ll / max(1, len(probs)),
        )

    def missing(self, text: str) -> str:
        """The characters of `text` this posterior has no column for (scored at `floor`)."""
        return "".join(ch for ch in dict.fromkeys(text) if ch not in self._columns)

    def log_likelihood(self, text: str) -> float:
        """log P(text | crop) under this model (natural log): the CTC forward algorithm in
        the log domain over every alignment of `text` with the frames. Characters without a
        column score `floor` per frame; -inf when the frames cannot emit `text`."""
        lp = self.log_probs.astype(np.float64)
        blank = lp[:, 0]
        if not text:
            return float(blank.sum())
        emissions = np.empty((lp.shape[0], len(text)), dtype=np.float64)
        for j, char in enumerate(text):
            columns = self._columns.get(char)
            if columns is None:
                emissions[:, j] = self.floor
            elif len(columns) == 1:
                emissions[:, j] = lp[:, columns[0]]
            else:
                emissions[:, j] = np.logaddexp.reduce(lp[:, columns], axis=1)
        return ctc_forward(blank, emissions, text)


def _runs(best: np.ndarray) -> list[tuple[int, int, int]]:
    """(column, start, end) of each run of one non-blank best class: the emitted characters."""
    if best.size == 0:
        return []
    edges = np.flatnonzero(best[1:] != best[:-1]) + 1
    starts = np.concatenate(([0], edges))
    ends = np.concatenate((edges, [best.size]))
    return [(int(best[s]), int(s), int(e)) for s, e in zip(starts, ends, strict=True) if best[s]]


def ctc_forward(blank: np.ndarray, emissions: np.ndarray, labels: Sequence[str]) -> float:
    """log of the summed probability of every CTC alignment of `labels` with the frames.

    `blank` (T,) and `emissions` (T, n) are per-frame log-probabilities of the blank and of
    each label. The extended sequence is blank, l1, blank, l2, ..., ln, blank; a frame stays
    in a state, steps to the next, or skips a blank between two different labels (equal
    neighbours need a blank between them)."""
    frames, n = emissions.shape
    if len(labels) != n or blank.shape != (frames,):
        raise ValueError("blank, emissions and labels disagree on frames or length")
    states = 2 * n + 1
    emit = np.empty((frames, states), dtype=np.float64)
    emit[:, 0::2] = blank[:, None]
    emit[:, 1::2] = emissions
    skip = np.zeros(states, dtype=bool)
    for j in range(1, n):
        skip[2 * j + 1] = labels[j] != labels[j - 1]
    alpha = np.full(states, -np.inf)
    if frames == 0:
        return -math.inf
    alpha[0] = emit[0, 0]
    alpha[1] = emit[0, 1]
    with np.errstate(invalid="ignore"):
        for t in range(1, frames):
            step = alpha.copy()
            np.logaddexp(step[1:], alpha[:-1], out=step[1:])
            skipped = np.logaddexp(step[2:], alpha[:-2])
            step[2:] = np.where(skip[2:], skipped, step[2:])
            alpha = step + emit[t]
    total = np.logaddexp(alpha[-1], alpha[-2])
    return float(total) if not np.isnan(total) else -math.inf


def prune(
    engine: str, probs: np.ndarray, charset: Sequence[str], min_prob: float = PRUNE_PROB
) -> Posterior:
    """A posterior from one crop's (T, C) softmax probabilities that keeps only the columns
    reaching `min_prob` in some frame (and the blank). A large alphabet (PP-OCR's 18,710
    classes) makes a full matrix megabytes per line, while a line gives real weight to a
    few hundred; a dropped character reads as log(min_prob) in every frame, an upper bound
    of what it had."""
    keep = probs.max(axis=0) >= min_prob
    keep[0] = True
    columns = np.flatnonzero(keep)
    kept = probs[:, columns]
    with np.errstate(divide="ignore"):
        log_probs = np.log(np.maximum(kept, np.finfo(np.float32).tiny)).astype(np.float32)
    return Posterior(
        engine=engine,
        log_probs=log_probs,
        charset=tuple(charset[c] for c in columns),
        floor=math.log(min_prob),
    )


def crop_key(image: Image.Image) -> str:
    """A crop's identity by its pixels: the same pixels give the same posterior."""
    digest = hashlib.sha1(image.tobytes(), usedforsecurity=False)
    digest.update(f"{image.mode}{image.size}".encode())
    return digest.hexdigest()


class PosteriorCache:
    """The posteriors of recently read crops, by (model version, crop key), bounded in
    bytes; the oldest go first. Thread-safe: a worker may score while another thread reads."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str], Posterior] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, version: str, key: str) -> Posterior | None:
        with self._lock:
            found = self._items.get((version, key))
            if found is not None:
                self._items.move_to_end((version, key))
            return found

    def put(self, version: str, key: str, posterior: Posterior) -> None:
        size = posterior.log_probs.nbytes
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop((version, key), None)
            if old is not None:
                self._bytes -= old.log_probs.nbytes
            self._items[(version, key)] = posterior
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= dropped.log_probs.nbytes

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


RECENT = PosteriorCache()


def recall(
    version: str,
    crops: Sequence[Image.Image],
    read: Callable[[Sequence[Image.Image], Sequence[str]], list[Posterior]],
) -> list[Posterior]:
    """Each crop's posterior under the model `version`: from RECENT where that model read
    the same pixels recently, else from `read(crops, keys)` (one batched call for all the
    others; it keeps what it reads in RECENT)."""
    keys = [crop_key(c) for c in crops]
    found = [RECENT.get(version, key) for key in keys]
    missing = [i for i, posterior in enumerate(found) if posterior is None]
    if missing:
        fresh = read([crops[i] for i in missing], [keys[i] for i in missing])
        if len(fresh) != len(missing):
            raise RuntimeError(f"{len(fresh)} posteriors for {len(missing)} crops")
        for i, posterior in zip(missing, fresh, strict=True):
            found[i] = posterior
    return [posterior for posterior in found if posterior is not None]
