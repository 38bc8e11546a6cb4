"""A process on the embedded defaults loads no library only some pages or some stores need:
matplotlib (~18 MB) draws formulas, boto3 (~11 MB) talks to S3. Each runs in a fresh
interpreter, so what another test imported cannot hide an import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def loaded_after(code: str) -> set[str]:
    """The top-level modules of a fresh interpreter after running `code`."""
    probe = code + "\nimport sys\nprint(' '.join({m.split('.')[0] for m in sys.modules}))\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


@pytest.mark.parametrize("library", ["matplotlib", "boto3", "botocore"])
def test_the_page_path_and_a_local_store_load_no_optional_library(
    library: str, tmp_path: Path
) -> None:
    loaded = loaded_after(
        "import ocrfleet.cli, ocrfleet.pipeline.page, ocrfleet.tasks.worker\n"
        "from ocrfleet.config import Settings\n"
        "from ocrfleet.scorers.render import renderer_version\n"
        "from ocrfleet.scorers.render.formula import latex_body\n"
        "from ocrfleet.storage import open_store, read_uri\n"
        f"settings = Settings(store_url='file://{tmp_path}')\n"
        "uri = open_store(settings).put('k', b'x')\n"
        "assert read_uri(uri, settings) == b'x'\n"
        "renderer_version(); latex_body('$x^2$')\n"
    )
    assert library not in loaded


@pytest.mark.parametrize(
    ("code", "library"),
    [
        ("from ocrfleet.storage import S3Store", "boto3"),
        (
            "from PIL import Image\n"
            "from ocrfleet.ir import Category\n"
            "from ocrfleet.scorers.render import render\n"
            "render('$x^2$', Category.formula, (120, 40))",
            "matplotlib",
        ),
    ],
)
def test_the_library_loads_when_it_is_needed(code: str, library: str) -> None:
    assert library in loaded_after(code)
