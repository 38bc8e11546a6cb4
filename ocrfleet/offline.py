"""Keep a process offline and inside its own directories.

onnxruntime's Python package phones home (a DNS look-up of its telemetry host) and writes a
device id under `~/.cache/Microsoft` unless `ORT_DISABLE_TELEMETRY` is set before it loads:
importing this module sets it, and the engine modules import this module first.
`prepare` then points every library cache and temp directory of this process (and the
processes it starts) into `OCRFLEET_CACHE_DIR`, so a run writes nothing under `$HOME`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

#: Hub clients never reach out: models load from local paths or not at all.
OFFLINE_FLAGS = {
    "ORT_DISABLE_TELEMETRY": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
}
#: Variable -> sub-directory of the cache directory.
CACHE_DIRS = {
    "XDG_CACHE_HOME": "xdg",
    "MPLCONFIGDIR": "matplotlib",
    "HF_HOME": "huggingface",
    "TORCH_HOME": "torch",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TRITON_CACHE_DIR": "triton",
    "TMPDIR": "tmp",
}


def prepare(cache_dir: Path) -> Path:
    """Set the offline flags and send every cache into `cache_dir`; returns its absolute
    path. Call before matplotlib, torch or transformers are imported (they read these once)."""
    root = Path(cache_dir).expanduser().absolute()
    os.environ.update(OFFLINE_FLAGS)
    for variable, name in CACHE_DIRS.items():
        path = root / name
        path.mkdir(parents=True, exist_ok=True)
        os.environ[variable] = str(path)
    tempfile.tempdir = None  # gettempdir() caches its first answer; make it read TMPDIR again
    return root
