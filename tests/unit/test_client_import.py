"""An upload service imports `ocrfleet.client` without pulling in any model library."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

HEAVY = ["torch", "transformers", "rapidocr", "onnxruntime", "cv2", "pypdfium2", "torchvision"]


def test_client_import_pulls_in_no_model_library() -> None:
    code = (
        "import json, sys\n"
        "import ocrfleet.client, ocrfleet.fleet_cli\n"
        "from ocrfleet.tasks.app import app\n"
        "app.loader.import_default_modules\n"  # attribute only: sending needs no task module
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_client_computes_run_id_without_models() -> None:
    """submit() needs the run id; computing it must not load torch or transformers (the
    engines' descriptions still import rapidocr's package to find its model files)."""
    code = (
        "import json, sys\n"
        "from ocrfleet.config import Settings\n"
        "from ocrfleet.runs import run_config, run_id_of\n"
        "run_id = run_id_of(run_config(Settings()))\n"
        f"print(json.dumps([run_id, [m for m in {HEAVY[:2]!r} if m in sys.modules]]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    run_id, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(run_id) == 64
    assert loaded == []
