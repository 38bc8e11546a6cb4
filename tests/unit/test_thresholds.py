"""Threshold tables, AUROC and the labelled-set loader, on small hand-made sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont

from ocrfleet import ir
from ocrfleet.thresholds import (
    Row,
    auroc,
    best_accept_rate,
    load_dataset,
    plot,
    threshold_table,
)

LABELS = [True, True, False, True, False, True]
SCORES = [0.95, 0.80, 0.70, 0.60, 0.20, None]


def test_table_counts_and_precision_by_hand() -> None:
    rows = [row[:4] for row in threshold_table(LABELS, SCORES, [0.0, 0.65, 0.75, 0.9, 0.99])]
    assert rows[0] == Row(0.0, 5 / 6, 3 / 5, 5)[:4]  # None is never accepted
    assert rows[1] == Row(0.65, 3 / 6, 2 / 3, 3)[:4]
    assert rows[2] == Row(0.75, 2 / 6, 1.0, 2)[:4]
    assert rows[3] == Row(0.9, 1 / 6, 1.0, 1)[:4]
    assert rows[4] == Row(0.99, 0.0, None, 0)[:4]


def test_accept_rate_never_rises_with_the_threshold() -> None:
    rows = threshold_table(LABELS, SCORES)
    rates = [row.accept_rate for row in rows]
    assert [row.threshold for row in rows] == sorted(row.threshold for row in rows)
    assert all(a >= b for a, b in zip(rates, rates[1:], strict=False))
    assert rows[0].threshold == 0.0 and rows[-1].threshold == 1.0


def test_threshold_is_inclusive() -> None:
    (row,) = threshold_table([True], [0.5], [0.5])
    assert row.n_accepted == 1


def test_mismatched_lengths_are_an_error() -> None:
    with pytest.raises(ValueError, match="2 labels but 1 scores"):
        threshold_table([True, False], [0.1])


def test_auroc_by_hand() -> None:
    assert auroc([True, False], [0.9, 0.1]) == 1.0
    assert auroc([True, False], [0.1, 0.9]) == 0.0
    assert auroc([True, False], [0.5, 0.5]) == 0.5
    # 3 positives x 2 negatives: pairs won 0.9>0.7, 0.9>0.2, 0.8>0.7, 0.8>0.2, 0.6>0.2 = 5/6
    assert auroc(LABELS[:5], SCORES[:5]) == pytest.approx(5 / 6)
    # an unscored unit ranks below everything
    assert auroc([False, True], [None, 0.0]) == 1.0


def test_auroc_needs_both_classes() -> None:
    with pytest.raises(ValueError, match="both"):
        auroc([True, True], [0.1, 0.2])


def test_best_accept_rate_at_a_precision() -> None:
    row = best_accept_rate(LABELS, SCORES, 0.99)
    assert row is not None and row.threshold == 0.8 and row.n_accepted == 2
    assert best_accept_rate([False], [0.9], 0.5) is None


def _crop(path: Path, text: str) -> None:
    font = ImageFont.truetype("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", 24)
    image = Image.new("RGB", (300, 40), "white")
    ImageDraw.Draw(image).text((6, 6), text, font=font, fill="black")
    image.save(path)


def test_clopper_pearson_matches_known_values() -> None:
    from ocrfleet.thresholds import clopper_pearson

    # reference values: scipy.stats.beta.ppf(0.025, k, n-k+1) and ppf(0.975, k+1, n-k)
    assert clopper_pearson(5, 10) == pytest.approx((0.187086, 0.812914), abs=1e-6)
    assert clopper_pearson(990, 1000) == pytest.approx((0.981687, 0.995194), abs=1e-6)
    assert clopper_pearson(0, 10) == pytest.approx((0.0, 0.308497), abs=1e-6)
    assert clopper_pearson(10, 10)[0] == pytest.approx(0.025 ** (1 / 10), abs=1e-9)


def test_chosen_threshold_is_the_lowest_whose_lower_bound_keeps_the_promise() -> None:
    from ocrfleet.thresholds import choose_threshold, clopper_pearson

    # 400 right answers score 0.9..1.0; below 0.9, one wrong in every 50; the worst
    # 200 units are all wrong.
    labels = [True] * 400 + [i % 50 != 0 for i in range(600)] + [False] * 200
    scores = [0.9 + i / 4000 for i in range(400)] + [0.5 + i / 1500 for i in range(600)]
    scores += [0.1] * 200
    choice = choose_threshold(labels, scores, 0.99)
    assert choice is not None and choice.lower_bound >= 0.99
    assert clopper_pearson(choice.n_correct, choice.n_accepted)[0] == choice.lower_bound
    # one step lower no longer keeps it (or the point precision fails first)
    lower = max(s for s in scores if s < choice.threshold)
    accepted = [label for label, s in zip(labels, scores, strict=True) if s >= lower]
    assert clopper_pearson(sum(accepted), len(accepted))[0] < 0.99
    # a set that is 98% right everywhere cannot promise 99%
    assert choose_threshold([i % 50 != 0 for i in range(5000)], list(range(5000)), 0.99) is None


def test_table_reports_the_lower_bound_beside_the_point_estimate() -> None:
    (row,) = threshold_table([True] * 99 + [False], [1.0] * 100, [0.5])
    assert row.precision == 0.99 and 0.94 < row.lower_bound < 0.99


def test_load_dataset_resolves_crops_next_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "crops").mkdir()
    _crop(tmp_path / "crops" / "a.png", "hello world")
    records = [
        {"crop": "crops/a.png", "text": "hello world", "category": "text", "label": 1},
        {"crop": "crops/a.png", "text": "hel1o world", "category": "text", "label": 0},
    ]
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
    examples = load_dataset(path)
    assert [e.label for e in examples] == [True, False]
    assert examples[1].unit.text == "hel1o world"
    assert examples[0].unit.category == ir.Category.text
    assert examples[0].unit.crop.size == (300, 40) and examples[0].unit.crop.mode == "RGB"


def test_load_dataset_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps({"crop": "missing.png", "text": "x", "label": 1}) + "\n")
    with pytest.raises(ValueError, match=r"set.jsonl:1"):
        load_dataset(path)
    path.write_text(json.dumps({"crop": "missing.png", "text": "x", "label": 3}) + "\n")
    with pytest.raises(ValueError, match="label must be 0 or 1"):
        load_dataset(path)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "plot.png"
    plot(threshold_table(LABELS, SCORES), out)
    with Image.open(out) as image:
        assert image.format == "PNG" and image.width > 100


def test_run_thresholds_scores_a_labelled_set_with_the_configured_scorer(tmp_path: Path) -> None:
    from ocrfleet.config import Settings
    from ocrfleet.thresholds import run_thresholds

    _crop(tmp_path / "a.png", "Total due 1,250.00")
    _crop(tmp_path / "b.png", "Received with thanks")
    records = [
        {"crop": "a.png", "text": "Total due 1,250.00", "category": "text", "label": 1},
        {"crop": "a.png", "text": "Total due 1,750.00", "category": "text", "label": 0},
        {"crop": "b.png", "text": "Received with thanks", "category": "text", "label": 1},
        {"crop": "b.png", "text": "Recieved wit thanks", "category": "text", "label": 0},
    ]
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    rows = run_thresholds(path, Settings(scorer="consensus"))
    assert [row.threshold for row in rows] == [i / 20 for i in range(21)]
    assert rows[0].n_accepted == 4 and rows[0].precision == 0.5
    # somewhere the right texts are accepted and the wrong ones are not
    assert any(row.n_accepted == 2 and row.precision == 1.0 for row in rows)


def test_shipped_lines_name_each_threshold_and_what_the_shortcuts_skip() -> None:
    from ocrfleet.config import Settings
    from ocrfleet.scorers.consensus import load_calibration
    from ocrfleet.thresholds import shipped_threshold_lines

    lines = shipped_threshold_lines(Settings(scorer="consensus"))
    calibration = load_calibration()
    for engine in calibration.thresholds:
        assert any(line.startswith(f"shipped {engine}/text: ") for line in lines)
        (screen,) = [line for line in lines if line.startswith(f"shipped screen {engine}: ")]
        lost, accepted = (
            int(v) for v in screen.split(", ")[1].split(" accepted")[0].split(" of their ")
        )
        assert lost <= 0.01 * accepted
        for stage in ("second stage", "early accept"):
            (line,) = [line for line in lines if line.startswith(f"shipped {stage} {engine}: ")]
            bound = line.split("95% lower bound ")[1].rstrip(")")
            assert bound == "None" or float(bound) >= 0.99
    assert shipped_threshold_lines(Settings(scorer="jev")) == []
