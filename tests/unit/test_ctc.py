"""CTC evidence: the forward algorithm against brute force, greedy decoding, evidence,
characters outside the alphabet, pruning and the posterior cache."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from PIL import Image

from ocrfleet.scorers.ctc import (
    BLANK,
    UNKNOWN_LOG_PROB,
    Posterior,
    PosteriorCache,
    crop_key,
    prune,
)


def _random_posterior(rng: np.random.Generator, frames: int, classes: int) -> Posterior:
    logits = rng.normal(scale=2.0, size=(frames, classes))
    log_probs = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    charset = (BLANK, *"abcdefgh"[: classes - 1])
    return Posterior("test", log_probs.astype(np.float32), charset)


def _brute_force(posterior: Posterior, text: str) -> float:
    """Sum over every path of T classes whose collapse (merge repeats, drop blanks) is text."""
    lp = posterior.log_probs.astype(np.float64)
    frames, classes = lp.shape
    total = -math.inf
    for path in itertools.product(range(classes), repeat=frames):
        collapsed = [c for i, c in enumerate(path) if c != 0 and (i == 0 or path[i - 1] != c)]
        if "".join(posterior.charset[c] for c in collapsed) == text:
            total = np.logaddexp(total, sum(lp[t, c] for t, c in enumerate(path)))
    return float(total)


def test_forward_equals_brute_force_on_tiny_random_posteriors() -> None:
    rng = np.random.default_rng(17)
    checked = impossible = 0
    for frames in range(1, 7):
        for classes in (2, 3):
            posterior = _random_posterior(rng, frames, classes)
            letters = posterior.charset[1:]
            texts = [""] + [
                "".join(p) for n in range(1, 4) for p in itertools.product(letters, repeat=n)
            ]
            for text in texts:
                expected = _brute_force(posterior, text)
                got = posterior.log_likelihood(text)
                if math.isinf(expected):
                    assert got == -math.inf, (frames, classes, text)
                    impossible += 1
                else:
                    assert got == pytest.approx(expected, abs=1e-5), (frames, classes, text)
                    checked += 1
    assert checked > 60 and impossible > 10  # both kinds of text were compared


def _log_domain_forward(posterior: Posterior, text: str) -> float:
    """The textbook recursion, state by state in the log domain: slow, and plainly right."""
    lp = posterior.log_probs.astype(np.float64)
    ext = [0]
    for char in text:
        ext += [posterior.charset.index(char), 0]
    alpha = [-math.inf] * len(ext)
    alpha[0] = lp[0, ext[0]]
    if len(ext) > 1:
        alpha[1] = lp[0, ext[1]]
    for t in range(1, lp.shape[0]):
        new = []
        for s, column in enumerate(ext):
            terms = [alpha[s]]
            if s >= 1:
                terms.append(alpha[s - 1])
            if s >= 3 and column != 0 and ext[s - 2] != column:
                terms.append(alpha[s - 2])
            new.append(float(np.logaddexp.reduce(terms)) + lp[t, column])
        alpha = new
    return float(np.logaddexp(alpha[-1], alpha[-2])) if len(ext) > 1 else alpha[0]


def test_long_texts_and_batches_agree_with_the_log_domain_recursion() -> None:
    """Lines of a few hundred frames have likelihoods far below what a float can hold as a
    probability: the scaled recursion must still give the log-domain value, alone or in a
    batch of texts (a hopeless text in the batch does not disturb the others)."""
    rng = np.random.default_rng(23)
    posterior = _random_posterior(rng, 300, 6)
    letters = "".join(posterior.charset[1:])
    texts = ["".join(rng.choice(list(letters), size=n)) for n in (0, 1, 40, 120, 149)]
    texts.append("a" * 160)  # needs 319 frames: impossible
    expected = [_log_domain_forward(posterior, text) for text in texts]
    assert min(e for e in expected if e > -math.inf) < -800  # exp underflows: scaling needed
    together = posterior.log_likelihoods(texts)
    alone = [posterior.log_likelihood(text) for text in texts]
    for want, got, single in zip(expected, together, alone, strict=True):
        if math.isinf(want):
            assert got == single == -math.inf
        else:
            assert got == pytest.approx(want, rel=1e-9) and single == pytest.approx(want, rel=1e-9)


def test_likelihoods_of_all_texts_sum_to_one() -> None:
    """Every path collapses to exactly one text: P(text) over all texts sums to 1."""
    posterior = _random_posterior(np.random.default_rng(3), 5, 3)
    texts = [""] + ["".join(p) for n in range(1, 6) for p in itertools.product("ab", repeat=n)]
    total = np.logaddexp.reduce([posterior.log_likelihood(t) for t in texts])
    assert total == pytest.approx(0.0, abs=1e-5)


def _sharp(path: str, charset: tuple[str, ...], sure: float = 0.9) -> Posterior:
    """A posterior whose best class per frame follows `path` ('-' = blank)."""
    columns = {c: i for i, c in enumerate(charset)}
    rest = (1.0 - sure) / (len(charset) - 1)
    probs = np.full((len(path), len(charset)), rest)
    for t, char in enumerate(path):
        probs[t, 0 if char == "-" else columns[char]] = sure
    return Posterior("test", np.log(probs).astype(np.float32), charset)


CHARSET = (BLANK, "a", "b", "c", " ")


def test_greedy_merges_repeats_and_drops_blanks() -> None:
    assert _sharp("-aa-a-bb--c", CHARSET).text() == "aabc"
    assert _sharp("a b", CHARSET).text() == "a b"
    assert _sharp("----", CHARSET).text() == ""


def test_repeated_character_needs_a_blank_between() -> None:
    assert _sharp("aa", CHARSET).log_likelihood("aa") == -math.inf  # two frames, no blank
    assert math.isfinite(_sharp("a-a", CHARSET).log_likelihood("aa"))
    assert _sharp("ab", CHARSET).log_likelihood("abc") == -math.inf  # longer than the frames


def test_empty_text_is_the_all_blank_path() -> None:
    posterior = _sharp("-a--", CHARSET)
    expected = float(posterior.log_probs[:, 0].astype(np.float64).sum())
    assert posterior.log_likelihood("") == pytest.approx(expected)
    assert _sharp("----", CHARSET).log_likelihood("") > posterior.log_likelihood("")
    evidence = _sharp("----", CHARSET).evidence()
    assert (evidence.min_char_prob, evidence.min_margin) == (1.0, 1.0)
    assert Posterior("test", np.zeros((0, 5), np.float32), CHARSET).log_likelihood("") == 0.0


def test_greedy_reading_beats_every_substitution() -> None:
    posterior = _sharp("-ab-c-", CHARSET)
    best = posterior.log_likelihood("abc")
    for i, char in itertools.product(range(3), "abc "):
        other = "abc"[:i] + char + "abc"[i + 1 :]
        if other != "abc":
            assert posterior.log_likelihood(other) < best


def test_unknown_characters_score_the_floor_and_never_raise() -> None:
    posterior = _sharp("-ab-", CHARSET)
    assert posterior.missing("abé€a") == "é€"
    foreign = posterior.log_likelihood("aé")
    assert math.isfinite(foreign)
    # The foreign character costs about the floor per frame it takes, far below any known one.
    assert foreign < posterior.log_likelihood("ac") + UNKNOWN_LOG_PROB / 2
    assert posterior.log_likelihood("éé") < foreign  # two foreign characters cost more


def test_evidence_finds_the_weakest_character() -> None:
    probs = np.full((5, 5), 0.02)
    probs[0, 1], probs[0, 0] = 0.9, 0.04  # a: sure
    probs[1, 0] = 0.92  # blank
    probs[2, 2], probs[2, 3] = 0.50, 0.44  # b, with c close behind
    probs[3, 0] = 0.92
    probs[4, 3], probs[4, 0] = 0.8, 0.14  # c
    posterior = Posterior("test", np.log(probs).astype(np.float32), CHARSET)
    assert posterior.text() == "abc"
    evidence = posterior.evidence()
    assert evidence.min_char_prob == pytest.approx(0.50, abs=1e-5)
    assert evidence.min_margin == pytest.approx(0.06, abs=1e-5)
    greedy = math.log(0.9) + 2 * math.log(0.92) + math.log(0.5) + math.log(0.8)
    assert evidence.mean_log_prob == pytest.approx(greedy / 3, abs=1e-5)


def test_evidence_leaves_out_a_doubtful_space_the_label_rule_drops() -> None:
    charset = (BLANK, "a", "b", ":", " ")
    probs = np.full((7, 5), 0.01)
    for t, (column, sure) in enumerate([(1, 0.96), (0, 0.96), (3, 0.96), (4, 0.6), (0, 0.96),
                                        (2, 0.96), (0, 0.96)]):  # fmt: skip
        probs[t, column] = sure
    beside_colon = Posterior("test", np.log(probs).astype(np.float32), charset)
    assert beside_colon.text() == "a: b"
    assert beside_colon.evidence().min_char_prob == pytest.approx(0.96, abs=1e-5)
    probs[2] = 0.01
    probs[2, 1] = 0.96  # "aa b": the same doubtful space between two words counts
    between_words = Posterior("test", np.log(probs).astype(np.float32), charset)
    assert between_words.text() == "aa b"
    assert between_words.evidence().min_char_prob == pytest.approx(0.6, abs=1e-5)


def test_a_character_is_judged_at_its_most_confident_frame() -> None:
    probs = np.full((3, 5), 0.01)
    probs[:, 0] = [0.4, 0.02, 0.4]
    probs[:, 1] = [0.57, 0.95, 0.57]  # 'a' over three frames, sure in the middle one
    posterior = Posterior("test", np.log(probs).astype(np.float32), CHARSET)
    assert posterior.text() == "a"
    assert posterior.evidence().min_char_prob == pytest.approx(0.95, abs=1e-5)


def test_duplicate_columns_of_one_character_add_up() -> None:
    probs = np.array([[0.2, 0.3, 0.5]])
    posterior = Posterior("test", np.log(probs).astype(np.float32), (BLANK, "x", "x"))
    assert posterior.log_likelihood("x") == pytest.approx(math.log(0.8), abs=1e-6)


def test_characters_the_label_rule_reads_alike_are_one_character() -> None:
    charset = (BLANK, "a", '"', "\u201c", ";")
    probs = np.full((3, 5), 0.01)
    probs[0, 1] = 0.96  # a
    probs[1, 0] = 0.96
    probs[2, 3], probs[2, 2] = 0.52, 0.45  # a curly or a straight quote: the same text
    torn = Posterior("test", np.log(probs).astype(np.float32), charset)
    assert torn.text() == "a\u201c"
    (_, quote) = torn.emitted()
    assert quote.prob == pytest.approx(0.97, abs=1e-5)
    assert quote.margin == pytest.approx(0.96, abs=1e-5)  # against the blank and ";"
    assert torn.evidence().min_char_prob == pytest.approx(0.96, abs=1e-5)
    assert torn.log_likelihood('a"') == pytest.approx(torn.log_likelihood("a\u201d"), abs=1e-9)
    assert torn.missing("a\u201d") == ""  # "”" has no column of its own, but reads as '"'
    probs[2, 2] = 0.01
    probs[2, 4] = 0.45  # a quote or a semicolon: two texts, and the doubt stays
    doubtful = Posterior("test", np.log(probs).astype(np.float32), charset)
    assert doubtful.evidence().min_char_prob == pytest.approx(0.53, abs=1e-5)
    assert doubtful.emitted()[1].margin == pytest.approx(0.08, abs=1e-5)


def test_shape_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="charset"):
        Posterior("test", np.zeros((3, 4), np.float32), CHARSET)
    with pytest.raises(ValueError, match="blank"):
        Posterior("test", np.zeros((3, 2), np.float32), ("a", "b"))


def test_prune_keeps_what_matters_and_bounds_the_rest() -> None:
    rng = np.random.default_rng(5)
    classes = 200
    logits = rng.normal(size=(12, classes)) - 30.0  # most classes near zero probability
    logits[:, :6] += 32.0  # a few classes carry the weight
    probs = np.exp(logits - np.logaddexp.reduce(logits, axis=1, keepdims=True))
    charset = (BLANK, *(chr(0x4E00 + i) for i in range(classes - 1)))
    full = Posterior("test", np.log(probs).astype(np.float32), charset)
    pruned = prune("test", probs, charset)
    assert len(pruned.charset) < 20
    assert pruned.text() == full.text()
    kept = "".join(pruned.charset[1:4])
    assert pruned.log_likelihood(kept) == pytest.approx(full.log_likelihood(kept), abs=1e-4)
    dropped = next(c for c in charset[1:] if c not in pruned.charset)
    assert pruned.floor == pytest.approx(math.log(1e-5))
    assert full.log_likelihood(dropped) <= pruned.log_likelihood(dropped)


def test_cache_is_bounded_and_keyed_by_pixels() -> None:
    one = Image.new("L", (8, 4), 255)
    two = one.copy()
    two.putpixel((0, 0), 0)
    assert crop_key(one) == crop_key(one.copy()) != crop_key(two)
    posterior = _sharp("-ab-", CHARSET)
    cache = PosteriorCache(max_bytes=posterior.log_probs.nbytes * 2)
    for n in range(3):
        cache.put("v1", str(n), posterior)
    assert cache.get("v1", "0") is None  # the oldest went first
    assert cache.get("v1", "2") is posterior
    assert cache.get("v2", "2") is None  # another model version is another entry


def test_a_reading_is_scored_as_its_label_with_or_without_a_silent_space() -> None:
    from ocrfleet.scorers.features import ctc_features, ctc_scores

    posterior = _sharp("-a-:-b-", (BLANK, "a", "b", ":", " "))  # sure there is no space
    scores = ctc_scores(posterior)
    spaced = scores.label_log_likelihood("a: b")
    assert spaced > posterior.log_likelihood("a: b") + 1.0
    assert spaced >= posterior.log_likelihood("a:b")
    features = ctc_features("a: b", {"rapidocr": scores}, ["a:b"])
    assert features["ctc_rapidocr_cand_gap"] >= 0.0  # the same text as the model's reading
    misread = ctc_features("a: a", {"rapidocr": scores}, ["a:b"])
    assert misread["ctc_rapidocr_cand_gap"] < -1.0
