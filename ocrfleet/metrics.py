"""Text accuracy metrics shared by tests and benchmarks.

CER here is the Levenshtein distance between whitespace-folded strings divided by the
folded reference length, so line breaks and indentation in ground-truth files do not count
as errors while a missing or extra space between words still does.
"""

from __future__ import annotations

import re

import numpy as np

_WS = re.compile(r"\s+")


def normalize_ws(text: str) -> str:
    """Fold every whitespace run (spaces, tabs, newlines) to one space and strip the ends."""
    return _WS.sub(" ", text).strip()


def levenshtein(a: str, b: str) -> int:
    """Unit-cost edit distance (insert, delete, substitute) between two strings.

    Row by row in numpy: the insertion term of a row is a running minimum, so each row is a
    handful of vector operations and whole pages (thousands of characters) take milliseconds.
    """
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    b_codes = np.fromiter((ord(c) for c in b), dtype=np.int64, count=len(b))
    offsets = np.arange(len(b) + 1, dtype=np.int64)
    prev = offsets.copy()
    for i, char in enumerate(a, start=1):
        substitute = prev[:-1] + (b_codes != ord(char))
        delete = prev[1:] + 1
        row = np.empty_like(prev)
        row[0] = i
        row[1:] = np.minimum(substitute, delete)
        # insert: row[j] = min_k<=j (row[k] + j - k)  ==  j + cummin(row[k] - k)
        prev = np.minimum.accumulate(row - offsets) + offsets
    return int(prev[-1])


def cer(hyp: str, ref: str) -> float:
    """Character error rate of `hyp` against `ref`, both whitespace-folded.

    An empty reference gives 0.0 for an empty hypothesis and 1.0 otherwise, so the value is
    always defined; it can exceed 1.0 when the hypothesis is much longer than the reference.
    """
    hyp_n, ref_n = normalize_ws(hyp), normalize_ws(ref)
    if not ref_n:
        return 0.0 if not hyp_n else 1.0
    return levenshtein(hyp_n, ref_n) / len(ref_n)
