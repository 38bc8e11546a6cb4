"""Local model checkpoint folders: their fingerprint (for run_id) and how they are opened.

Weights are never downloaded: a checkpoint is a local folder named in the settings, and a
missing folder is a clear error at worker start."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ocrfleet.errors import ConfigError


class CheckpointError(ConfigError):
    """A checkpoint folder cannot be used (missing path, missing files, wrong model): a
    configuration error (exit 2), named by its setting."""


def checkpoint_folder(path: Path | None, variable: str) -> Path:
    """`path` as an existing checkpoint folder with a config.json, or a CheckpointError
    naming the setting to fix."""
    if path is None:
        raise CheckpointError(f"{variable} is not set: it must name a local checkpoint folder")
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"{variable} is not a folder: {folder}")
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"no config.json in the checkpoint folder {folder} ({variable})")
    return folder


def folder_sha256(folder: Path) -> str:
    """One hash over every file of the checkpoint (config, weights, processor, template)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder).as_posix()
        if any(part.startswith(".") for part in relative.split("/")) or relative.startswith(
            "README"
        ):
            continue
        file_digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda h=handle: h.read(1 << 20), b""):
                file_digest.update(block)
        digest.update(f"{relative}\0{file_digest.hexdigest()}\n".encode())
    return digest.hexdigest()
