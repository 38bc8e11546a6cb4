"""MiniCPMRecogniser on a tiny MiniCPM-OCR checkpoint loaded through the production path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ocrfleet import ir  # noqa: E402
from ocrfleet.config import Settings  # noqa: E402
from ocrfleet.engines import describe_engines, load_recognisers  # noqa: E402
from ocrfleet.engines.minicpm import PROMPTS, MiniCPMRecogniser, prompts_sha256  # noqa: E402
from ocrfleet.pipeline.recognise import recognise  # noqa: E402
from ocrfleet.pipeline.review import ENGINE_TRUNCATED, decide  # noqa: E402

pytestmark = pytest.mark.models

MAX_NEW_TOKENS = 6


def crop_of(text: str, size: tuple[int, int]) -> Image.Image:
    crop = Image.new("RGB", size, (246, 244, 240))
    ImageDraw.Draw(crop).text((4, 4), text, fill=(20, 20, 20))
    return crop


CROPS = [
    crop_of("hello", (160, 40)),
    crop_of("world wide web", (300, 60)),
    crop_of("x", (30, 30)),
    crop_of("Total 1,234", (200, 40)),
]


def settings_for(path: Path, **overrides) -> Settings:
    values = {
        "engines": ["minicpm"],
        "minicpm_model_path": path,
        "minicpm_dtype": "float32",
        "minicpm_device": "cpu",
        "minicpm_batch_size": 4,
        "minicpm_attn_implementation": "sdpa",
        "minicpm_max_new_tokens": MAX_NEW_TOKENS,
        **overrides,
    }
    return Settings(**values)


@pytest.fixture(scope="module")
def engine(tiny_minicpm_path: Path) -> MiniCPMRecogniser:
    [rec] = load_recognisers(settings_for(tiny_minicpm_path))
    assert isinstance(rec, MiniCPMRecogniser)
    return rec


def test_loads_through_settings_and_reads_a_batch(engine, tiny_minicpm_path):
    readings = engine.recognise(CROPS)
    assert len(readings) == len(CROPS)
    assert all(isinstance(r.text, str) and r.text for r in readings)
    assert len({r.text for r in readings}) > 1  # the crops, not a constant, drive the text
    params = engine.params
    assert params["generation"]["do_sample"] is False
    assert params["generation"]["num_beams"] == 1
    assert params["generation"]["max_new_tokens"] == MAX_NEW_TOKENS
    assert (params["dtype"], params["batch_size"]) == ("float32", 4)
    assert params["attn_implementation"] == "sdpa"
    assert params["prompts_sha256"] == prompts_sha256()[:16]
    described = describe_engines(settings_for(tiny_minicpm_path))["recognisers"]
    assert described == [{"name": "minicpm", "version": engine.version}]
    other = describe_engines(settings_for(tiny_minicpm_path, minicpm_max_new_tokens=7))
    assert other["recognisers"][0]["version"] != engine.version


def test_batched_equals_one_at_a_time_token_for_token(engine):
    kinds = [ir.Category.text, ir.Category.table, ir.Category.formula, ir.Category.text]
    batched = engine.generate_tokens(CROPS, kinds)
    for index, (crop, kind) in enumerate(zip(CROPS, kinds, strict=True)):
        [alone] = engine.generate_tokens([crop], [kind])
        assert batched[index][: len(alone)] == alone, index
    assert len(set(PROMPTS.values())) == 3
    # The prompt follows the category: a table crop is not read like a text crop.
    assert engine.generate_tokens([CROPS[0]], [ir.Category.table]) != engine.generate_tokens(
        [CROPS[0]], [ir.Category.text]
    )


def test_a_generation_that_hits_the_limit_is_truncated(engine, tiny_minicpm_path, tmp_path):
    tokens = engine.generate_tokens(CROPS, [ir.Category.text] * len(CROPS))
    assert all(len(row) == MAX_NEW_TOKENS for row in tokens)
    assert all(r.truncated for r in engine.recognise(CROPS))

    # Same weights, but the checkpoint's generation config also ends on a token that crop 0
    # produces third and crop 1 never does: crop 0 now ends early, crop 1 still hits the limit.
    stop = tokens[0][2]
    assert stop not in tokens[1] and stop not in tokens[0][:2]
    folder = tmp_path / "early-stop"
    shutil.copytree(tiny_minicpm_path, folder)
    config_path = folder / "generation_config.json"
    config = json.loads(config_path.read_text())
    eos = config.get("eos_token_id")
    config["eos_token_id"] = [*([eos] if isinstance(eos, int) else eos or []), stop]
    config_path.write_text(json.dumps(config))
    [early] = load_recognisers(settings_for(folder))
    first, second = early.recognise(CROPS[:2])
    assert not first.truncated
    assert second.truncated
    decode = early.processor.tokenizer.decode
    assert first.text == decode(tokens[0][:2], skip_special_tokens=True).strip()

    # Through the pipeline: the truncated region goes to review as engine_truncated.
    page = Image.new("RGB", (400, 140), (246, 244, 240))
    page.paste(CROPS[0], (0, 0))
    page.paste(CROPS[1], (0, 60))
    regions = [
        ir.Region(number=1, bbox=ir.BBox(x0=0, y0=0, x1=160, y1=40)),
        ir.Region(number=2, bbox=ir.BBox(x0=0, y0=60, x1=300, y1=120)),
    ]
    candidates = recognise(page, regions, [early])
    assert [c.truncated for c in candidates] == [False, True]
    scores = [
        ir.Score(
            region_number=c.region_number,
            engine=c.engine,
            scorer="jev",
            scorer_version="t",
            verdict=ir.Verdict.scored,
            score=0.99,
        )
        for c in candidates
    ]
    decisions = decide(regions, candidates, scores, Settings(scorer="jev"))
    assert [d.flag_reason for d in decisions] == [None, ENGINE_TRUNCATED]


def test_repro_on_an_example_gives_identical_hashes(tiny_minicpm_path):
    """Three runs of a committed example under one run, MiniCPM-OCR reading every region."""
    from ocrfleet.repro import compare_documents, document_sha256
    from ocrfleet.repro_cli import run_times

    example = Path(__file__).resolve().parents[2] / "examples" / "photo.jpg"
    settings = settings_for(tiny_minicpm_path, minicpm_max_new_tokens=3)
    run_id, outputs = run_times(example, settings, 3)
    hashes = {document_sha256([p.sha256 for p in pages]) for pages in outputs}
    assert len(hashes) == 1
    assert compare_documents(outputs[0], outputs[2]) == []
    regions = outputs[0][0].result.regions
    candidates = outputs[0][0].result.candidates
    assert regions and all(c.engine == "minicpm" for c in candidates)
    assert len(run_id) == 64
