"""Classifying differences between two outputs of a page."""

from __future__ import annotations

from ocrfleet import ir
from ocrfleet.repro import PageOutput, classify_text, compare_pages, counts


def page(*lines: tuple[str, str], size: tuple[int, int] = (100, 100)) -> PageOutput:
    regions, candidates = [], []
    for number, (category, text) in enumerate(lines, start=1):
        bbox = ir.BBox(x0=0, y0=number * 10, x1=50, y1=number * 10 + 8)
        regions.append(ir.Region(number=number, category=ir.Category(category), bbox=bbox))
        candidates.append(ir.Candidate(region_number=number, engine="rapidocr", text=text))
    result = ir.PageResult(page_number=1, regions=regions, candidates=candidates)
    return PageOutput(1, size, result, "")


def test_text_classes():
    assert classify_text("a b", "a b") is None
    assert classify_text("a  b", "a b") == "whitespace"
    assert classify_text("价格，100元", "价格,100元") == "punctuation"  # full vs half width
    assert classify_text("Total: 5", "Total 5") == "punctuation"
    assert classify_text("Total 5", "Tota1 5") == "substitution"


def test_page_differences_name_their_regions():
    a = page(("title", "Report"), ("text", "one"), ("text", "two  lines"), ("text", "gone"))
    b = page(("header", "Report"), ("text", "one"), ("text", "two lines"), ("text", "new"),
             ("text", "more"))
    found = compare_pages(a, b)
    assert counts(found) == {"substitution": 1, "extra_line": 1, "whitespace": 1, "structure": 1}
    by_kind = {d.kind: d for d in found}
    assert (by_kind["structure"].region_a, by_kind["structure"].region_b) == (1, 1)
    assert (by_kind["whitespace"].region_a, by_kind["whitespace"].region_b) == (3, 3)
    assert by_kind["extra_line"].text_b in {"new", "more"}
    missing = compare_pages(b, page(("header", "Report"), ("text", "one")))
    assert counts(missing) == {"missing_line": 3}
    assert compare_pages(a, a) == []
