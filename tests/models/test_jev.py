"""JevScorer on a tiny Jev checkpoint loaded through the production path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ocrfleet.config import Settings  # noqa: E402
from ocrfleet.ir import Category, Verdict  # noqa: E402
from ocrfleet.scorers.base import Unit  # noqa: E402
from ocrfleet.scorers.jev import PROMPT_TEMPLATE, JevModelError, JevScorer  # noqa: E402
from ocrfleet.scorers.render import renderer_version  # noqa: E402

from .conftest import qwen35_reference_tokenizer  # noqa: E402

pytestmark = pytest.mark.models

VISION = "<|vision_start|><|image_pad|><|vision_end|>"
DOCUMENTED_PROMPT = (
    "<image>\nOCR文本：\n{text}\n<image>\n第一张图是原图，第二张图是上述 OCR 文本渲染得到的图片。\n"
    "请判断该 OCR 文本及其对应渲染图是否与原图内容一致。\n"
    "这是一个二分类任务：一致标为 1，不一致标为 0。"
)


def crop_of(text: str, size: tuple[int, int] = (160, 40)) -> Image.Image:
    """A page-like crop: dark strokes on off-white paper."""
    crop = Image.new("RGB", size, (246, 244, 240))
    draw = ImageDraw.Draw(crop)
    draw.text((4, 4), text, fill=(20, 20, 20))
    draw.line((4, size[1] - 6, size[0] - 8, size[1] - 6), fill=(30, 30, 30), width=2)
    return crop


def unit(text: str, number: int, category: Category = Category.text, crop=None) -> Unit:
    return Unit(
        crop=crop if crop is not None else crop_of(text),
        text=text,
        category=category,
        region_number=number,
        engine="rapidocr",
    )


@pytest.fixture(scope="module")
def scorer(tiny_jev_path: Path) -> JevScorer:
    settings = Settings(
        jev_model_path=tiny_jev_path,
        jev_dtype="float32",
        jev_device="cpu",
        jev_batch_size=4,
        jev_attn_implementation="sdpa",
    )
    return JevScorer(settings)


def test_prompt_is_the_documented_bytes() -> None:
    assert PROMPT_TEMPLATE == DOCUMENTED_PROMPT
    assert PROMPT_TEMPLATE.encode("utf-8") == DOCUMENTED_PROMPT.encode("utf-8")


def test_the_fixture_tokenizer_is_qwen35s(qwen35_tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    ours = AutoTokenizer.from_pretrained(qwen35_tokenizer_dir)
    reference = qwen35_reference_tokenizer()
    for sample in [
        DOCUMENTED_PROMPT,
        "Total: ¥1,234.56 — café\n\n\tx²",
        f"<|im_start|>user\n{VISION}",
    ]:
        assert ours.encode(sample, add_special_tokens=False) == reference.encode(sample)


def test_exact_prompt_bytes_reach_the_tokenizer(scorer: JevScorer) -> None:
    text = "Invoice {no} 总计 <image> ¥12"  # braces and a literal <image> stay text
    chat = scorer.prompt_for(text)
    expected = DOCUMENTED_PROMPT.replace("<image>", VISION).replace("{text}", text)
    assert chat == "<|im_start|>user\n" + expected + "<|im_end|>\n"
    # What the model really gets: decode the input ids, fold each image's pad run back.
    item = unit(text, 1)
    inputs = scorer.build_inputs([(item, scorer.render_unit(item))])
    ids = inputs["input_ids"][0][inputs["attention_mask"][0].bool()]
    decoded = scorer.processor.tokenizer.decode(ids.tolist())
    assert re.sub(r"(<\|image_pad\|>)+", "<|image_pad|>", decoded) == chat
    assert decoded.count(VISION[:16]) == 2


def test_images_go_in_as_crop_then_rendered(scorer: JevScorer) -> None:
    item = unit("Hello world", 1, crop=crop_of("Hello world", (200, 48)))
    rendered = scorer.render_unit(item)
    inputs = scorer.build_inputs([(item, rendered)])
    direct = scorer.processor.image_processor(images=[item.crop, rendered], return_tensors="pt")
    swapped = scorer.processor.image_processor(images=[rendered, item.crop], return_tensors="pt")
    assert torch.equal(inputs["pixel_values"], direct["pixel_values"])
    assert torch.equal(inputs["image_grid_thw"], direct["image_grid_thw"])
    assert not torch.equal(inputs["pixel_values"], swapped["pixel_values"])


def test_scores_are_probabilities_with_verdict_scored(scorer: JevScorer) -> None:
    units = [unit("Hello world", 1), unit("第一张 表格", 2), unit("x = 1", 3, Category.formula)]
    scores = scorer.score(units)
    assert [s.region_number for s in scores] == [1, 2, 3]
    for score in scores:
        assert score.verdict == Verdict.scored, score.error
        assert score.score is not None and 0.0 <= score.score <= 1.0
        assert score.scorer == "jev" and score.engine == "rapidocr"
        assert score.scorer_version == scorer.version
    assert len({round(s.score, 6) for s in scores}) > 1  # the inputs reach the model
    assert renderer_version(scorer.font_path) in scorer.version
    assert scorer.params["model_sha256"] in scorer.version
    assert scorer.params["dtype"] == "float32" and scorer.params["device"] == "cpu"
    assert scorer.params["batch_size"] == 4 and scorer.params["attn_implementation"] == "sdpa"


def test_batched_scores_equal_one_at_a_time(scorer: JevScorer) -> None:
    # Different crop sizes and text lengths: rows of the batch are padded differently.
    units = [
        unit("a", 1, crop=crop_of("a", (40, 20))),
        unit(
            "The quick brown fox jumps over the lazy dog", 2, crop=crop_of("The quick", (300, 60))
        ),
        unit("中文 和 English 混排 12345", 3, crop=crop_of("mixed", (180, 90))),
        unit("<table><tr><td>1</td><td>2</td></tr></table>", 4, Category.table),
        unit(r"\frac{1}{2}", 5, Category.formula, crop=crop_of("1/2", (64, 64))),
    ]
    pairs = [(u, scorer.render_unit(u)) for u in units]
    batched = scorer.forward(pairs)
    single = [scorer.forward([pair])[0] for pair in pairs]
    assert batched == pytest.approx(single, abs=1e-5)
    via_score = [s.score for s in scorer.score(units)]  # batch_size 4: a batch of 4, then 1
    assert via_score == pytest.approx(single, abs=1e-5)


def test_bad_latex_is_render_failed_and_the_rest_scored(scorer: JevScorer) -> None:
    scores = scorer.score(
        [
            unit(r"\frac{a}{", 1, Category.formula),
            unit("fine text", 2),
            unit("<tr>", 3, Category.table),
        ]
    )
    assert scores[0].verdict == Verdict.render_failed and scores[0].score is None
    assert "formula" in (scores[0].error or "")
    assert scores[1].verdict == Verdict.scored
    assert scores[2].verdict == Verdict.render_failed and "table" in (scores[2].error or "")


def test_empty_crop_and_text_are_precheck_failed(scorer: JevScorer) -> None:
    blank = Image.new("RGB", (80, 30), "white")
    scores = scorer.score([unit("hello", 1, crop=blank), unit("  ", 2), unit("ok", 3)])
    assert [s.verdict for s in scores] == [
        Verdict.precheck_failed,
        Verdict.precheck_failed,
        Verdict.scored,
    ]
    assert "empty crop" in (scores[0].error or "") and "empty candidate" in (scores[1].error or "")


def test_a_unit_whose_forward_raises_fails_alone(scorer: JevScorer) -> None:
    # 1000x4 px passes precheck and renders, but the Qwen-VL image processor refuses an
    # aspect ratio over 200: the batch fails, is retried one by one, and only this one fails.
    sliver = Image.new("RGB", (1000, 4), (246, 244, 240))
    ImageDraw.Draw(sliver).line((10, 1, 990, 1), fill=(20, 20, 20), width=2)
    units = [unit("left", 1), unit("a rule", 2, crop=sliver), unit("right", 3), unit("more", 4)]
    scores = scorer.score(units)
    assert [s.verdict for s in scores] == [
        Verdict.scored,
        Verdict.forward_failed,
        Verdict.scored,
        Verdict.scored,
    ]
    assert "aspect ratio" in (scores[1].error or "") and scores[1].score is None
    for position in (0, 2, 3):
        alone = scorer.forward([(units[position], scorer.render_unit(units[position]))])[0]
        assert scores[position].score == pytest.approx(alone, abs=1e-5)


def test_a_missing_model_is_a_clear_error_at_construction(tmp_path: Path) -> None:
    with pytest.raises(JevModelError, match="OCRFLEET_JEV_MODEL_PATH"):
        JevScorer(Settings(jev_model_path=None))
    with pytest.raises(JevModelError, match="not a folder"):
        JevScorer(Settings(jev_model_path=tmp_path / "absent"))
    with pytest.raises(JevModelError, match="config.json"):
        JevScorer(Settings(jev_model_path=tmp_path))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_runs_on_cuda_in_bfloat16(tiny_jev_path: Path) -> None:
    settings = Settings(
        jev_model_path=tiny_jev_path, jev_dtype="bfloat16", jev_device="auto", jev_batch_size=4
    )
    gpu = JevScorer(settings)
    assert gpu.params["device"].startswith("cuda") and gpu.params["dtype"] == "bfloat16"
    units = [unit("Hello", 1), unit("第一张", 2), unit(r"x^2", 3, Category.formula), unit("z", 4)]
    scores = gpu.score(units)
    assert all(s.verdict == Verdict.scored for s in scores), [s.error for s in scores]
    single = [gpu.forward([(u, gpu.render_unit(u))])[0] for u in units]
    assert [s.score for s in scores] == pytest.approx(single, abs=2e-2)  # bf16 padding noise


def test_a_checkpoint_declaring_the_released_architecture_loads(
    scorer: JevScorer, tiny_jev_path: Path, tmp_path: Path
) -> None:
    """The released Jev config says `MiniCPMOCRForSequenceClassification` (model type
    qwen3_5); it loads as Qwen3_5ForSequenceClassification with the same weights."""
    import json
    import shutil

    from ocrfleet.scorers.jev import JEV_ARCHITECTURES

    released = tmp_path / "released"
    shutil.copytree(tiny_jev_path, released)
    config = json.loads((released / "config.json").read_text())
    assert config["model_type"] == "qwen3_5"
    config["architectures"] = ["MiniCPMOCRForSequenceClassification"]
    (released / "config.json").write_text(json.dumps(config))
    settings = scorer.settings.model_copy(update={"jev_model_path": released})
    loaded = JevScorer(settings)
    assert type(loaded.model).__name__ == "Qwen3_5ForSequenceClassification"
    units = [unit("Total 1,234", 1), unit("hello", 2)]
    assert [s.score for s in loaded.score(units)] == pytest.approx(
        [s.score for s in scorer.score(units)], abs=1e-6
    )
    assert "MiniCPMOCRForSequenceClassification" in JEV_ARCHITECTURES

    config["architectures"] = ["LlamaForCausalLM"]
    (released / "config.json").write_text(json.dumps(config))
    with pytest.raises(JevModelError, match="LlamaForCausalLM"):
        JevScorer(settings)
