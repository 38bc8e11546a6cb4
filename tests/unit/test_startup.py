"""The worker start-up check on the CPU toolkit: devices, one warm-up region, refusals."""

from __future__ import annotations

import pytest

from ocrfleet.config import Settings
from ocrfleet.engines import load_recognisers
from ocrfleet.tasks.devices import StartupError, device_report
from ocrfleet.tasks.startup import startup_check
from ocrfleet.toolkit import load_toolkit

torch = pytest.importorskip("torch")


def test_the_cpu_toolkit_passes_and_reads_the_warm_up_region():
    report = startup_check(load_toolkit(Settings(layout="lines")))
    assert [m["name"] for m in report["models"]] == ["rapidocr", "consensus"]
    assert all(m["device"] == "cpu" for m in report["models"])
    assert "Warm" in report["warm_up"][0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_a_device_this_process_cannot_use_is_refused(tmp_path):
    with pytest.raises(StartupError, match="CUDA is not available"):
        device_report("cuda:0")
    (tmp_path / "config.json").write_text('{"model_type": "minicpm_ocr"}')
    settings = Settings(engines=["minicpm"], minicpm_model_path=tmp_path, minicpm_device="cuda")
    with pytest.raises(StartupError, match="cuda"):
        load_recognisers(settings)
