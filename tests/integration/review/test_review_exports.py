"""Reviews become training data and thresholds: both exports checked row by row against
DESIGN.md's formats (the prompts spelled out here byte for byte, images [crop, rendered]
for Jev), the split by page, and `ocrfleet thresholds --from-reviews`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sqlalchemy import select

from ocrfleet import ir
from ocrfleet.db.models import Candidate, Document, Page, Region, ReviewFlag, User
from ocrfleet.db.session import session_scope
from ocrfleet.review.exports import page_position
from ocrfleet.review.images import PageImages, region_crop, rendered_candidate
from ocrfleet.review.record import record_review
from ocrfleet.review.reviewed import reviewed_regions
from ocrfleet.review.users import get_account
from tests.integration.review.helpers import World, ocrfleet_cli, settings_for

pytestmark = pytest.mark.integration

# DESIGN.md, "Training exports" and "Jev scoring", byte for byte.
SFT_USER = "<image>\nText Recognition:"
JEV_PROMPT = (
    "<image>\nOCR文本：\n{text}\n<image>\n"
    "第一张图是原图，第二张图是上述 OCR 文本渲染得到的图片。\n"
    "请判断该 OCR 文本及其对应渲染图是否与原图内容一致。\n"
    "这是一个二分类任务：一致标为 1，不一致标为 0。"
)
CORRECTION = "Warehouse 3 - Shelf Inventory (corrected)"


def review_everything(url: str, world: World) -> dict[int, tuple[str, str]]:
    """Correct the first flagged region, mark the second unreadable, accept the rest (among
    them memo.tif's, on another page); returns region id -> (action, final text)."""
    decided: dict[int, tuple[str, str]] = {}
    with session_scope(url) as session:
        root = get_account(session, session.scalar(select(User.id).where(User.name == "root")), 0)
        assert root is not None
        flagged = session.execute(
            select(ReviewFlag.region_id, Page.document_id)
            .join(Region, Region.id == ReviewFlag.region_id)
            .join(Page, Page.id == Region.page_id)
            .order_by(ReviewFlag.id)
        ).all()
        assert {doc for _, doc in flagged} == set(world.documents.values())
        for index, (region_id, _) in enumerate(flagged):
            if index == 0:
                action, text = ir.ReviewAction.correct, CORRECTION
            elif index == 1:
                action, text = ir.ReviewAction.unreadable, ""
            else:
                action = ir.ReviewAction.accept
                text = session.scalar(select(Candidate.text).where(
                    Candidate.region_id == region_id, Candidate.engine == "rapidocr"))  # fmt: skip
            record_review(session, root, region_id, action, engine="rapidocr", text=text)
            decided[region_id] = (action.value, text)
    return decided


def rows_of(path: Path) -> list[dict]:
    lines = path.read_bytes().decode("utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    for line, row in zip(lines, rows, strict=True):  # one compact, non-escaped object a line
        assert line == json.dumps(row, ensure_ascii=False)
    return rows


def page_of(image_path: str) -> str:
    return Path(image_path).name.rsplit("-r", 1)[0]  # <sha16>-p0001


def test_exports_and_thresholds_from_reviews(
    review_db: str, world: World, tmp_path: Path
) -> None:
    decided = review_everything(review_db, world)
    with session_scope(review_db) as session:
        positions = sorted(
            {page_position(region.page_key) for region in reviewed_regions(session)}
        )
    assert len(positions) >= 2, "the reviews should span pages"
    fraction = (positions[0] + positions[-1]) / 2  # so both splits get pages
    out = tmp_path / "out"
    sft, jev = out / "ocr-sft.jsonl", out / "jev.jsonl"
    for kind, path in (("ocr-sft", sft), ("jev", jev)):
        done = ocrfleet_cli(
            ["export", kind, str(path), "--eval-fraction", str(fraction)], review_db, world
        )
        assert done.returncode == 0, done.stderr

    settings = settings_for(review_db, world)
    pages = PageImages(settings)
    with session_scope(review_db) as session:
        rows = session.execute(
            select(Region.id, Document.sha256, Page.number, Region.number, Page.image_uri,
                   Region.x0, Region.y0, Region.x1, Region.y1)
            .join(Page, Page.id == Region.page_id)
            .join(Document, Document.id == Page.document_id)
            .where(Region.id.in_(decided))
        ).all()  # fmt: skip
    # Export image names: <sha256[:16]>-p<page>-r<region>[-<engine>].png
    region_of = {f"{sha[:16]}-p{page:04d}-r{num:04d}": rid for rid, sha, page, num, *_ in rows}
    crops = {
        rid: np.asarray(region_crop(pages.get(uri), bbox))
        for rid, _, _, _, uri, *bbox in rows
    }

    def region_of_image(image_path: str) -> int:
        return region_of[Path(image_path).stem.removesuffix("-rapidocr")]

    # OCR-SFT: one row per region with a final text (the unreadable one has none).
    sft_rows = rows_of(sft) + rows_of(out / "ocr-sft.eval.jsonl")
    finals = sorted(text for action, text in decided.values() if action != "unreadable")
    assert sorted(row["messages"][1]["content"] for row in sft_rows) == finals
    for row in sft_rows:
        assert list(row) == ["messages", "images"]
        user, assistant = row["messages"]
        assert user == {"role": "user", "content": SFT_USER}
        assert list(assistant) == ["role", "content"] and assistant["role"] == "assistant"
        (image,) = row["images"]
        rid = region_of_image(image)
        assert assistant["content"] == decided[rid][1]
        pixels = np.asarray(Image.open(out / image).convert("RGB"))
        assert np.array_equal(pixels, crops[rid])

    # Jev: one row per reviewed candidate, [crop, rendered], label from the review.
    jev_train, jev_eval = rows_of(jev), rows_of(out / "jev.eval.jsonl")
    assert len(jev_train) + len(jev_eval) == len(decided)  # one engine, every text renders
    labels = []
    for row in jev_train + jev_eval:
        assert list(row) == ["messages", "images", "label"]
        (message,) = row["messages"]
        assert message["role"] == "user"
        content = message["content"]
        prefix, suffix = JEV_PROMPT.split("{text}")
        assert content.startswith(prefix) and content.endswith(suffix)
        text = content[len(prefix) : len(content) - len(suffix)]
        crop_path, rendered_path = row["images"]
        assert rendered_path.endswith("-rapidocr.png") and not crop_path.endswith("-rapidocr.png")
        rid = region_of_image(crop_path)
        assert region_of_image(rendered_path) == rid
        crop = Image.open(out / crop_path).convert("RGB")
        assert np.array_equal(np.asarray(crop), crops[rid])
        rendered = Image.open(out / rendered_path).convert("RGB")
        expected = rendered_candidate(crop, text, "text", settings.render_font_path)
        assert np.array_equal(np.asarray(rendered), np.asarray(expected))
        action, final = decided[rid]
        assert row["label"] == (1 if action == "accept" else 0), (action, text, final)
        labels.append(row["label"])
    assert 0 in labels and 1 in labels  # real engine output on both sides

    # No page on both sides, in either export.
    for train, held in ((rows_of(sft), rows_of(out / "ocr-sft.eval.jsonl")),
                        (jev_train, jev_eval)):  # fmt: skip
        train_pages = {page_of(r["images"][0]) for r in train}
        eval_pages = {page_of(r["images"][0]) for r in held}
        assert not train_pages & eval_pages
        assert train_pages and eval_pages

    # Thresholds with the reviewers' decisions as labels.
    done = ocrfleet_cli(
        ["thresholds", "--from-reviews", "--category", "text", "--precision", "0.6", "--json"],
        review_db,
        world,
    )
    assert done.returncode == 0, done.stderr
    (proposal,) = json.loads(done.stdout)
    with session_scope(review_db) as session:
        text_regions = set(
            session.scalars(
                select(Region.id).where(Region.id.in_(decided), Region.category == "text")
            ).all()
        )
    accepted = sum(1 for rid in text_regions if decided[rid][0] == "accept")
    assert proposal["category"] == "text"
    assert (proposal["regions"], proposal["correct"]) == (len(text_regions), accepted)
    zero = next(row for row in proposal["rows"] if row["threshold"] == 0.0)
    assert zero["precision"] == pytest.approx(accepted / len(text_regions))
    if proposal["proposed"] is not None:
        assert proposal["proposed"]["precision"] >= 0.6
