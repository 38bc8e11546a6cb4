"""CER: whitespace-folded Levenshtein distance over the reference length."""

from __future__ import annotations

import random

from ocrfleet.metrics import cer, levenshtein, normalize_ws


def slow_levenshtein(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def test_levenshtein_matches_the_textbook_recurrence():
    rng = random.Random(3)
    for _ in range(500):
        a = "".join(rng.choice("abé ") for _ in range(rng.randint(0, 15)))
        b = "".join(rng.choice("abé ") for _ in range(rng.randint(0, 15)))
        assert levenshtein(a, b) == slow_levenshtein(a, b) == levenshtein(b, a)
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3


def test_normalize_ws_folds_runs_and_strips():
    assert normalize_ws("  a\tb \n\n c  ") == "a b c"
    assert normalize_ws("\n \t") == ""


def test_cer_ignores_layout_whitespace_but_counts_word_spaces():
    assert cer("hello   world\n", "hello\nworld") == 0.0
    assert cer("helloworld", "hello world") == 1 / 11
    assert cer("hxllo", "hello") == 0.2


def test_cer_with_empty_reference_is_defined():
    assert cer("", " \n") == 0.0
    assert cer("x", "") == 1.0
    assert cer("", "abcd") == 1.0
