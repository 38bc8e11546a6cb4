"""The one rule for "this candidate is usable as is": every fit, bench and threshold report
labels candidates with `same_text`, so a number measured anywhere means the same thing.

Two texts are the same when they are equal after `canonical`: Unicode NFKC (ligatures,
full-width forms, the one-character ellipsis become plain characters), typographic quotes,
dashes and ellipses folded to ASCII (guillemets, primes and the modifier apostrophe are
quotes too, and so are TeX's two-backtick and two-apostrophe quotes, which UW3's
transcripts use), soft hyphens and zero-width characters dropped, every whitespace run
folded to one space, and whitespace next to ASCII punctuation dropped:
"TOTAL :" and "TOTAL:", "AMT (RM)" and "AMT(RM)" are the same text to a reader, and
transcribers space them both ways (SROIE does), so a label that counted them would call
correct readings wrong at random. A missing space between two words is still an error.
Case is kept unless the caller says the ground truth's case cannot be trusted (SROIE
upper-cases many transcripts).
"""

from __future__ import annotations

import re
import unicodedata

_WS = re.compile(r"\s+")
_PUNCT_SPACE = re.compile(r" ?([!-/:-@\[-`{-~]) ?")
_TEX_QUOTE = re.compile(r"''")

# After NFKC: what is still typographic, folded to the ASCII a reader would accept.
_FOLD = str.maketrans(
    {
        **dict.fromkeys("\u2018\u2019\u201a\u201b\u2032\u2035\u00b4\u0060", "'"),
        **dict.fromkeys("\u2039\u203a\u02bc", "'"),  # single guillemets, modifier apostrophe
        **dict.fromkeys("\u201c\u201d\u201e\u201f\u2033\u2036\u00ab\u00bb", '"'),
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212\u2043\ufe58", "-"),
        "\u2026": "...",
        "\u00a0": " ",
        **dict.fromkeys("\u00ad\u200b\u200c\u200d\u2060\ufeff", ""),
    }
)


def canonical(text: str, *, case_sensitive: bool = True) -> str:
    """The form two texts are compared in (see the module docstring)."""
    # Folded before NFKC too, which would turn a double prime into two primes.
    folded = unicodedata.normalize("NFKC", text.translate(_FOLD)).translate(_FOLD)
    folded = _TEX_QUOTE.sub('"', folded)  # `` is '' by now
    folded = _PUNCT_SPACE.sub(r"\1", _WS.sub(" ", folded).strip())
    return folded if case_sensitive else folded.casefold()


# ASCII punctuation, and what `_FOLD` turns into it: whitespace next to one is dropped by
# `canonical`.
_PUNCT_LIKE = re.escape(
    "".join(chr(c) for c in range(0x21, 0x7F) if not chr(c).isalnum())
    + "".join(chr(k) for k, v in _FOLD.items() if v and not v.isalnum() and not v.isspace())
)
_SILENT = re.compile(rf"^\s+|\s+$|\s+(?=[{_PUNCT_LIKE}])|(?<=[{_PUNCT_LIKE}])\s+")


def silent(text: str) -> list[bool]:
    """Per character of `text`: True for whitespace `canonical` drops (at either end, or
    next to punctuation). A reader's doubt about such a space is no doubt about the label,
    so character evidence leaves them out (`ocrfleet.scorers.ctc`)."""
    marks = [False] * len(text)
    for match in _SILENT.finditer(text):
        marks[match.start() : match.end()] = [True] * (match.end() - match.start())
    return marks


def tight(text: str) -> str:
    """`text` without its `silent` whitespace, otherwise as written: with `text`, the two
    spellings of one label a CTC model is asked about ("TOTAL :" and "TOTAL:")."""
    return _SILENT.sub("", text)


def same_text(candidate: str, truth: str, *, case_sensitive: bool = True) -> bool:
    """The label: True when `candidate` is usable as is for `truth`."""
    return canonical(candidate, case_sensitive=case_sensitive) == canonical(
        truth, case_sensitive=case_sensitive
    )
