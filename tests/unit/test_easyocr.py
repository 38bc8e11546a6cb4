"""The easyocr engine in the default install (no torch): it reads real scanned lines, gives
posteriors from the reading's own model call, checks its weights and refuses anything in a
checkpoint that is not a state dict, keeps its graph in the cache directory only, and takes
odd crops without failing the batch."""

from __future__ import annotations

import os
import pickle
import random
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError

from ocrfleet.config import Settings
from ocrfleet.engines import describe_engines, load_recognisers
from ocrfleet.engines.easyocr import (
    MODEL_MD5,
    WIDTH_BUDGET,
    EasyOCRRecogniser,
    ModelFileError,
    default_model_path,
    load_weights,
    padded_width,
    prepare,
)
from ocrfleet.metrics import levenshtein
from ocrfleet.scorers import ctc
from tests.unit.test_ctc_engines import UW3, substitutions, uw3_lines


@pytest.fixture(scope="module")
def easy(tmp_path_factory: pytest.TempPathFactory) -> EasyOCRRecogniser:
    return EasyOCRRecogniser(
        batch_size=4, threads=1, cache_dir=tmp_path_factory.mktemp("easyocr-cache")
    )


def test_reads_real_scanned_lines(easy) -> None:
    lines = uw3_lines(32)
    readings = easy.recognise([crop for crop, _ in lines])
    pairs = zip(readings, lines, strict=True)
    errors = sum(levenshtein(text, truth) for (text, _), (_, truth) in pairs)
    chars = sum(len(truth) for _, truth in lines)
    assert 1.0 - errors / chars >= 0.90, (errors, chars)
    assert all(0.0 <= confidence <= 1.0 for _, confidence in readings)


def test_posteriors_are_the_readings_own(easy) -> None:
    crops = [crop for crop, _ in uw3_lines(6)]
    rng = random.Random(5)
    ctc.RECENT.clear()
    readings = easy.recognise(crops)
    posteriors = easy.posteriors(crops)
    for posterior, (text, _), crop in zip(posteriors, readings, crops, strict=True):
        assert posterior is ctc.RECENT.get(easy.version, ctc.crop_key(crop))
        assert posterior.engine == "easyocr"
        assert posterior.text() == text
        assert posterior.log_probs.shape == (padded_width(crop) // 4 - 1, 97)
        best = posterior.log_likelihood(text)
        others = [text + ".", *substitutions(text, "aeiostnrl0123456789.,-E", rng, 5)]
        assert all(score < best for score in posterior.log_likelihoods(others)), text


def test_a_reading_does_not_depend_on_its_batch(easy) -> None:
    crops = [crop for crop, _ in uw3_lines(8)]
    ctc.RECENT.clear()
    together = easy.posteriors(crops)
    ctc.RECENT.clear()
    alone = easy.posteriors([crops[5]])[0]
    np.testing.assert_allclose(alone.log_probs, together[5].log_probs, atol=1e-4)


def test_calls_side_by_side_read_what_one_thread_reads(easy, tmp_path: Path) -> None:
    crops = [crop for crop, _ in uw3_lines(12)]
    two = EasyOCRRecogniser(batch_size=4, threads=2, cache_dir=tmp_path)
    keys = [str(i) for i in range(len(crops))]
    alone, side_by_side = easy._read(crops, keys), two._read(crops, keys)
    for a, b in zip(alone, side_by_side, strict=True):
        np.testing.assert_array_equal(a.log_probs, b.log_probs)


def test_a_model_call_holds_at_most_the_width_budget(easy, monkeypatch) -> None:
    # A call's memory grows with its columns: crops share a call up to the budget, and a
    # crop wider than the budget is read alone.
    lines = [crop for crop, _ in uw3_lines(8)]
    short = [line.crop((0, 0, line.height * 3, line.height)) for line in lines]
    crops = lines + short
    assert max(padded_width(c) for c in crops) > WIDTH_BUDGET
    session, shapes = easy._session, []

    class Recorded:
        def run(self, names, feeds):
            shapes.append(feeds["image"].shape)
            return session.run(names, feeds)

    monkeypatch.setattr(easy, "_session", Recorded())
    ctc.RECENT.clear()
    assert len(easy.posteriors(crops)) == len(crops)
    assert sum(shape[0] for shape in shapes) == len(crops)
    assert all(n == 1 or n * width <= WIDTH_BUDGET for n, _, _, width in shapes), shapes
    assert any(n > 1 for n, *_ in shapes), shapes


def test_odd_crops_are_read_and_bounded(easy) -> None:
    crops = [
        Image.new("RGB", (1, 1), "white"),
        Image.new("RGB", (3, 400), "black"),  # taller than wide
        Image.new("RGB", (2000, 4), "gray"),  # wider than MAX_RATIO: squeezed
        Image.new("RGB", (1, 200_000), "white"),  # far taller: bounded, not 12.8 M rows
    ]
    readings = easy.recognise(crops)
    assert [type(text) for text, _ in readings] == [str] * 4
    assert prepare(crops[2]).shape == (64, 64 * 64)
    with pytest.raises(ValueError, match="empty image"):
        easy.recognise([Image.new("RGB", (0, 5))])


def test_wrong_weights_are_refused_at_load(tmp_path: Path) -> None:
    copy = tmp_path / "english_g2.pth"
    shutil.copyfile(default_model_path(), copy)
    with copy.open("r+b") as fh:
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ModelFileError, match=f"expected {MODEL_MD5}"):
        EasyOCRRecogniser(model_path=copy)
    with pytest.raises(ModelFileError, match="never downloaded"):
        EasyOCRRecogniser(model_path=tmp_path / "missing.pth")


class _Payload:
    def __reduce__(self):
        return (os.getcwd, ())


def test_checkpoint_unpickler_resolves_nothing_but_a_state_dict(tmp_path: Path) -> None:
    hostile = tmp_path / "hostile.pth"
    with zipfile.ZipFile(hostile, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"x": _Payload()}, protocol=2))
    with pytest.raises(pickle.UnpicklingError, match="not part of a state dict"):
        load_weights(hostile)
    weights = load_weights(default_model_path())
    assert weights["Prediction.weight"].shape == (97, 256)
    assert weights["FeatureExtraction.ConvNet.12.num_batches_tracked"].dtype == np.int64


def test_graph_is_cached_in_the_cache_dir_only(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    crop = uw3_lines(1)[0][0]
    first = EasyOCRRecogniser(threads=1, cache_dir=cache)
    stored = sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file())
    assert stored == [f"easyocr/english_g2-{MODEL_MD5}-g1.{ext}" for ext in ("onnx", "sha256")]
    onnx_file = cache / stored[0]
    # A damaged cached graph is rebuilt, never run.
    onnx_file.write_bytes(onnx_file.read_bytes()[:-10] + b"0123456789")
    second = EasyOCRRecogniser(threads=1, cache_dir=cache)
    ctc.RECENT.clear()
    assert first.recognise([crop]) == second.recognise([crop])
    assert [p.name for p in tmp_path.iterdir()] == ["cache"]  # nothing beside the cache
    # A cache directory that cannot be written costs start-up time, not the engine.
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder should be")
    third = EasyOCRRecogniser(threads=1, cache_dir=blocked)
    assert third.recognise([crop]) == second.recognise([crop])


def test_engine_is_known_to_settings_and_run_id(tmp_path: Path) -> None:
    settings = Settings(engines="rapidocr,easyocr", cache_dir=tmp_path)
    described = {r["name"]: r["version"] for r in describe_engines(settings)["recognisers"]}
    assert described["easyocr"].startswith(f"english_g2-{MODEL_MD5[:12]}+")
    (reader,) = load_recognisers(settings.model_copy(update={"engines": ["easyocr"]}))
    assert isinstance(reader, EasyOCRRecogniser) and reader.version == described["easyocr"]
    with pytest.raises(ValidationError, match="easyocr"):
        Settings(engines="easyocr2")
    wrong = settings.model_copy(update={"easyocr_model_path": tmp_path / "nope.pth"})
    with pytest.raises(ModelFileError, match="OCRFLEET_EASYOCR_MODEL_PATH"):
        describe_engines(wrong)


def test_runs_without_torch(tmp_path: Path) -> None:
    """The default install has no torch: the engine must not need it, even where it is."""
    crop = sorted(UW3.glob("*.png"))[0] if UW3.is_dir() else None
    if crop is None:
        pytest.skip(f"no UW3 lines under {UW3}")
    script = (
        "import sys; sys.modules['torch'] = None\n"  # any import of torch now fails
        "from pathlib import Path\n"
        "from ocrfleet.engines.easyocr import EasyOCRRecogniser\n"
        "from ocrfleet.pipeline.images import load_image\n"
        "engine = EasyOCRRecogniser(threads=1, cache_dir=Path(sys.argv[2]))\n"
        "print(engine.recognise([load_image(open(sys.argv[1], 'rb').read())])[0][0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(crop), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    truth = " ".join(crop.with_suffix("").with_suffix(".gt.txt").read_text().split())
    assert done.stdout.strip() == truth


def test_a_bad_model_path_is_a_configuration_error_of_the_cli(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "OCRFLEET_ENGINES": "easyocr",
        "OCRFLEET_EASYOCR_MODEL_PATH": str(tmp_path / "english_g2.pth"),
    }
    page = tmp_path / "page.png"
    Image.new("RGB", (64, 32), "white").save(page)
    done = subprocess.run(
        [sys.executable, "-m", "ocrfleet.cli", "run", str(page)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "OCRFLEET_EASYOCR_MODEL_PATH" in done.stdout + done.stderr


def test_words_are_placed_where_their_characters_are(easy) -> None:
    """Word boxes come from the CTC frames: a line moved right by its own width (white
    space on its left) gets every box in the right half, and in order."""
    lines = uw3_lines(4)
    shifted = []
    for crop, _ in lines:
        wide = Image.new("RGB", (2 * crop.width, crop.height), "white")
        wide.paste(crop.convert("RGB"), (crop.width, 0))
        shifted.append(wide)
    for (crop, _), (text, _, words), (wide_text, _, wide_words) in zip(
        lines,
        easy.recognise_words([crop for crop, _ in lines]),
        easy.recognise_words(shifted),
        strict=True,
    ):
        assert [w.text for w in words] == text.split()
        assert words[0].bbox.x0 < 0.2 * crop.width and words[-1].bbox.x1 > 0.8 * crop.width
        assert [w.text for w in wide_words] == wide_text.split()
        assert all(w.bbox.x0 >= 0.9 * crop.width for w in wide_words)
        pairs = zip(wide_words, wide_words[1:], strict=False)
        assert all(a.bbox.x1 <= b.bbox.x0 + 8 for a, b in pairs)
        assert all(0.0 < w.confidence <= 1.0 for w in words)
