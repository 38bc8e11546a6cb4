"""Character-level evidence from CTC recognisers: what a model saw in one crop, frame by
frame, and how plausible any reading of that crop is under it.

A CTC recogniser (RapidOCR's PP-OCR, EasyOCR's CRNN) turns a crop into T frames, each a
probability distribution over its C classes (class 0 is the CTC blank). `Posterior` keeps
those per-frame log-probabilities and answers three questions:

- `text()`: the greedy reading (best class per frame, repeats merged, blanks dropped), the
  same decoding the engines use;
- `evidence()`: how sure the model is of that reading, character by character (the weakest
  character, the smallest margin to the runner-up class, the greedy path's log-likelihood
  per character; whitespace the label rule drops is left out): one doubtful character
  shows here, while a line's mean confidence hides it; `emitted()` gives each character
  with its frames, probability and margin;
- `log_likelihood(text)`: log P(text | crop), the CTC forward algorithm over every alignment
  of `text` with the frames, for ANY text: another engine's reading scored under this model
  ("does PP-OCR find tesseract's reading plausible?", cross-scoring); `log_likelihoods(texts)`
  scores several texts in one pass over the frames.

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
from functools import cached_property, lru_cache

import numpy as np
from PIL import Image

from ocrfleet import labels

BLANK = ""  # the CTC blank's entry in a charset (column 0)
# Per-frame log-probability of a character the model has no column for (about 2e-9): far
# below any class a trained CTC model gives real weight to, finite so that likelihoods of
# texts with a foreign character still order by how much of the rest fits.
UNKNOWN_LOG_PROB = -20.0
# Columns whose probability stays under this in every frame of a crop are dropped from its
# posterior (see `prune`); they then read as `floor` = log(PRUNE_PROB), an upper bound.
PRUNE_PROB = 1e-5
_TINY = 1e-300
_SPAN = 600.0


@dataclass(frozen=True)
class CharEvidence:
    """How sure a CTC model is of its own greedy reading of a crop."""

    min_char_prob: float  # weakest emitted character's probability (1.0 for empty text)
    min_margin: float  # smallest top-1 minus top-2 probability over emitting frames
    mean_log_prob: float  # the greedy path's log-likelihood per emitted character


@dataclass(frozen=True)
class Emission:
    """One character of a greedy reading: its frames [start, end) and how sure of it."""

    char: str
    start: int
    end: int
    prob: float  # at its most confident frame
    margin: float  # top-1 minus top-2 probability at that frame


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
        """Columns per character as the label rule reads it (`fold_key`); a character with
        several columns is their sum."""
        columns: dict[str, list[int]] = {}
        for index, char in enumerate(self.charset[1:], start=1):
            columns.setdefault(fold_key(char), []).append(index)
        return columns

    @cached_property
    def _classes(self) -> np.ndarray:
        """Per column, its character's index in `_columns` plus one (0: the blank)."""
        classes = np.zeros(len(self.charset), dtype=np.intp)
        for number, columns in enumerate(self._columns.values(), start=1):
            classes[columns] = number
        return classes

    def _folded(self) -> np.ndarray:
        """(T, classes) probabilities: per frame, each character's columns summed. Not
        kept: a posterior can live in `RECENT`, whose budget counts `log_probs` only."""
        folded = np.zeros((len(self._columns) + 1, self.log_probs.shape[0]))
        np.add.at(folded, self._classes, np.exp(self.log_probs.T.astype(np.float64)))
        return folded.T

    @cached_property
    def _best(self) -> np.ndarray:
        return self.log_probs.argmax(axis=1)

    def text(self) -> str:
        """The greedy CTC reading: the best class per frame, repeats merged, blanks dropped."""
        return "".join(self.charset[c] for c, _, _ in _runs(self._best))

    def emitted(self) -> list[Emission]:
        """The greedy reading's characters with their frames. Each is judged at its most
        confident frame (the frames at a character's edges share their weight with the
        blank, which is no doubt about which character it is): its probability there, and
        the margin to the runner-up there (negative where another character is likelier).
        A character's probability is that of every column the label rule reads as it
        (`fold_key`): a model torn between “ and " is sure of the text."""
        return self._emitted(self._folded())

    def _emitted(self, folded: np.ndarray) -> list[Emission]:
        out = []
        for column, start, end in _runs(self._best):
            own = self._classes[column]
            peak = start + int(folded[start:end, own].argmax())
            row = folded[peak].copy()
            prob = float(row[own])
            row[own] = 0.0
            out.append(
                Emission(
                    char=self.charset[column],
                    start=start,
                    end=end,
                    prob=prob,
                    margin=prob - float(row.max()),
                )
            )
        return out

    def evidence(self) -> CharEvidence:
        """Evidence on the greedy reading, from its characters (see `emitted`), leaving out
        the whitespace the label rule cannot see (`labels.silent`: at either end, or next
        to punctuation): doubt whether "reading: 048213" has its space is no doubt about
        the text, and counted as one it looked like a doubtful digit."""
        folded = self._folded()
        frames = np.arange(self.log_probs.shape[0])
        with np.errstate(divide="ignore"):
            path = np.log(folded[frames, self._classes[self._best]])
        chars = self._emitted(folded)
        quiet = labels.silent("".join(c.char for c in chars)) if chars else []
        if len(quiet) != len(chars):  # a multi-character class: nothing is left out
            quiet = [False] * len(chars)
        counted = [c for c, q in zip(chars, quiet, strict=True) if not q]
        greedy_ll = float(path.sum()) - sum(
            float(path[c.start : c.end].sum()) for c, q in zip(chars, quiet, strict=True) if q
        )
        return CharEvidence(
            min_char_prob=min((c.prob for c in counted), default=1.0),
            min_margin=min((c.margin for c in counted), default=1.0),
            mean_log_prob=greedy_ll / max(1, len(counted)),
        )

    def missing(self, text: str) -> str:
        """The characters of `text` this posterior has no column for (scored at `floor`)."""
        return "".join(ch for ch in dict.fromkeys(text) if fold_key(ch) not in self._columns)

    def log_likelihood(self, text: str) -> float:
        """log P(text | crop) under this model (natural log): the CTC forward algorithm over
        every alignment of `text` with the frames. Characters without a column score `floor`
        per frame; -inf when the frames cannot emit `text`."""
        return self.log_likelihoods([text])[0]

    def log_likelihoods(self, texts: Sequence[str]) -> list[float]:
        """`log_likelihood` of each text, in one pass over the frames for all of them (the
        pass is most of the cost, so scoring a crop's candidates together is cheaper)."""
        lp = self.log_probs.astype(np.float64)
        labels = [list(text) for text in texts]
        if not labels:
            return []
        emissions = [np.empty((lp.shape[0], len(chars)), dtype=np.float64) for chars in labels]
        for chars, block in zip(labels, emissions, strict=True):
            for j, char in enumerate(chars):
                columns = self._columns.get(fold_key(char))
                if columns is None:
                    block[:, j] = self.floor
                elif len(columns) == 1:
                    block[:, j] = lp[:, columns[0]]
                else:
                    block[:, j] = np.logaddexp.reduce(lp[:, columns], axis=1)
        return ctc_forward(lp[:, 0], emissions, labels)


@lru_cache(maxsize=4096)
def fold_key(char: str) -> str:
    """The character the label rule reads `char` as (`labels.canonical`, case kept) where
    that is one character ("“", "”" and "«" are all '"', "，" is ","), else `char`: a
    model's doubt between two characters of one key is no doubt about the text, so its
    evidence and likelihoods count them as one."""
    folded = labels.canonical(char)
    return folded if len(folded) == 1 else char


def _runs(best: np.ndarray) -> list[tuple[int, int, int]]:
    """(column, start, end) of each run of one non-blank best class: the emitted characters."""
    if best.size == 0:
        return []
    edges = np.flatnonzero(best[1:] != best[:-1]) + 1
    starts = np.concatenate(([0], edges))
    ends = np.concatenate((edges, [best.size]))
    return [(int(best[s]), int(s), int(e)) for s, e in zip(starts, ends, strict=True) if best[s]]


def ctc_forward(
    blank: np.ndarray, emissions: Sequence[np.ndarray], labels: Sequence[Sequence[str]]
) -> list[float]:
    """log of the summed probability of every CTC alignment of each label sequence with the
    frames, natural log; -inf where there is none.

    `blank` (T,) holds the blank's per-frame log-probabilities and `emissions[k]` (T, n_k)
    those of the n_k labels of sequence k. A sequence extends to blank, l1, blank, ...,
    ln, blank; a frame stays in a state, steps to the next, or skips a blank between two
    different labels (equal neighbours need a blank between them). All sequences run in one
    recursion, each in its own block of states; the recursion is in the probability domain,
    each frame's emissions scaled by their maximum within the block and each block's
    forward variables renormalised every frame, with the logs of those scales summed."""
    frames = blank.shape[0]
    sizes = [2 * len(seq) + 1 for seq in labels]
    starts = np.cumsum([0, *sizes[:-1]])
    total = int(sum(sizes))
    block = np.repeat(np.arange(len(sizes)), sizes)
    log_emit = np.empty((frames, total), dtype=np.float64)
    step = np.ones(total)  # from the previous state of the same block
    skip = np.zeros(total)  # from two states back: between two different labels
    for k, (seq, first) in enumerate(zip(labels, starts, strict=True)):
        if emissions[k].shape != (frames, len(seq)):
            raise ValueError("blank, emissions and labels disagree on frames or length")
        log_emit[:, first : first + sizes[k] : 2] = blank[:, None]
        log_emit[:, first + 1 : first + sizes[k] : 2] = emissions[k]
        step[first] = 0.0
        for j in range(1, len(seq)):
            skip[first + 2 * j + 1] = float(seq[j] != seq[j - 1])
    if frames == 0:
        return [0.0 if not seq else -math.inf for seq in labels]
    shift = np.maximum.reduceat(log_emit, starts, axis=1)  # (T, blocks)
    # Within a block, emissions more than _SPAN nats under the frame's best count as _SPAN
    # under it (float64 underflows near 745); no real posterior spreads that wide.
    emit = np.exp(np.maximum(log_emit - shift[:, block], -_SPAN))
    log_scale = shift.sum(axis=0)
    alpha = np.zeros(total)
    alpha[starts] = emit[0, starts]
    second = starts[np.array(sizes) > 1] + 1
    alpha[second] = emit[0, second]
    moved = np.empty(total)
    for t in range(1, frames):
        sums = np.maximum(np.add.reduceat(alpha, starts), _TINY)
        log_scale += np.log(sums)
        alpha /= sums[block]
        moved[:] = alpha
        moved[1:] += step[1:] * alpha[:-1]
        moved[2:] += skip[2:] * alpha[:-2]
        moved *= emit[t]
        alpha, moved = moved, alpha
    ends = np.cumsum(sizes) - 1
    out = []
    for k, size in enumerate(sizes):
        end = alpha[ends[k]] + (alpha[ends[k] - 1] if size > 1 else 0.0)
        out.append(float(log_scale[k] + math.log(end)) if end > 0.0 else -math.inf)
    return out


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
