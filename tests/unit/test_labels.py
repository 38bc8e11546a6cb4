"""The one label rule: what counts as the same text for every fit, bench and report."""

from __future__ import annotations

import dataclasses

import pytest

from ocrfleet.labels import canonical, same_text, silent, tight
from ocrfleet.review.reviewed import Reading, ReviewedRegion


def test_whitespace_runs_fold_and_ends_strip() -> None:
    assert same_text("  Total \t 12.00\n", "Total 12.00")
    assert not same_text("Total12.00", "Total 12.00")  # a missing space is still an error


def test_typographic_quotes_dashes_and_ellipses_fold_to_ascii() -> None:
    assert same_text("\u201cIt\u2019s 1990\u20131995\u2026\u201d", '"It\'s 1990-1995..."')
    assert same_text("em\u2014dash, minus \u22122", "em-dash, minus -2")
    assert canonical("\u2033") == '"'  # a double prime is a double quote, not two primes


def test_nfkc_folds_ligatures_and_full_width_forms() -> None:
    assert same_text("\ufb01ne \uff21\uff22\uff23 \u00bd", "fine ABC 1\u20442")
    assert same_text("soft\u00adhyphen zero\u200bwidth", "softhyphen zerowidth")


def test_case_is_kept_unless_asked() -> None:
    assert not same_text("Cashier:", "CASHIER:")
    assert same_text("Cashier:", "CASHIER:", case_sensitive=False)
    assert not same_text("Cashier", "CASHIER:", case_sensitive=False)


def test_wrong_characters_stay_wrong() -> None:
    for candidate, truth in [("8.59", "8.29"), ("0.40", "0.4"), ("l00", "100"), ("", "x")]:
        assert not same_text(candidate, truth)


def test_spacing_next_to_punctuation_is_not_significant() -> None:
    assert same_text("TOTAL :", "TOTAL:")
    assert same_text("Amt (RM)", "AMT(RM)", case_sensitive=False)
    assert same_text("PAX NO: 4", "PAX NO:4")
    assert not same_text("CASHIER ID", "CASHIERID")  # between two words it still counts
    assert not same_text("TOTAL:", "TOTAL")  # and so does the punctuation itself


def test_tex_quotes_are_double_quotes() -> None:
    assert same_text("a \u201cCPR summit.\u201d", "a ``CPR summit.''")


def test_guillemets_primes_and_the_modifier_apostrophe_are_quotes() -> None:
    assert same_text("\u00abDone\u00bb", '"Done"')
    assert same_text("\u2039Done\u203a", "'Done'")
    assert same_text("5\u2032 10\u2033", "5' 10\"")
    assert same_text("it\u02bcs", "it's")
    assert not same_text("\u00abDone\u00bb", "'Done'")  # a double quote is not a single one


def test_soft_hyphens_vanish_but_hard_hyphens_stay() -> None:
    assert canonical("infor\u00admation") == "information"
    assert not same_text("infor-mation", "information")


# The four strings on which the reviews' own fold used to disagree with this rule.
DISAGREED = [
    ("TOTAL :", "TOTAL:"),
    ("soft\u00adhyphen", "softhyphen"),
    ("\u00abquoted\u00bb", '"quoted"'),
    ("5\u2032", "5'"),
]


@pytest.mark.parametrize(("reading", "final"), DISAGREED)
def test_reviews_label_by_this_rule(reading: str, final: str) -> None:
    """Exports and threshold proposals from reviews ask `ReviewedRegion.usable`."""
    region = ReviewedRegion(
        region_id=1, sha256="0" * 64, page_number=1, image_uri="file:///page.png", number=0,
        category="text", bbox=(0, 0, 10, 10), chosen_engine="rapidocr", action="correct",
        final_text=final,
    )  # fmt: skip
    assert region.usable(Reading("rapidocr", reading, None, "scored", 0.5))
    assert not region.usable(Reading("rapidocr", reading + "x", None, "scored", 0.5))
    unreadable = dataclasses.replace(region, action="unreadable")
    assert not unreadable.usable(Reading("rapidocr", reading, None, "scored", 0.5))


@pytest.mark.parametrize(
    ("text", "spelled"),
    [
        ("TOTAL : 12.00", "TOTAL:12.00"),
        ("reading: 048213", "reading:048213"),
        (" a  b ", "a  b"),
        ("Feb 23-26, 2015", "Feb 23-26,2015"),
        ("x \u2014 y", "x\u2014y"),
        ("AMT (RM)", "AMT(RM)"),
    ],
)
def test_tight_drops_only_whitespace_the_rule_cannot_see(text: str, spelled: str) -> None:
    assert tight(text) == spelled and same_text(spelled, text)
    assert len(spelled) == sum(not quiet for quiet in silent(text))


def test_a_space_between_words_is_never_silent() -> None:
    assert silent("a b") == [False, False, False]
    assert tight("Total 12.00") == "Total 12.00"
