"""A virtualenv with what `pip install ocrfleet` (no extras) installs and nothing else: no
torch, no transformers. It is what an upload service or the README's client-only setup
runs, built offline in a second: a fresh `python -m venv` whose site-packages links the
test venv's installed distributions of the base requirements in pyproject.toml (what
`pip install .` installs now, whatever the test venv was installed from), closed over their
own requirements (markers evaluated, extras left out), and ocrfleet itself from the
repository.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]

MODELS_EXTRA = ("torch", "torchvision", "transformers")


class VenvUnavailable(RuntimeError):
    """The venv cannot be built offline here (a requirement is not installed)."""


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def base_requirements() -> list[str]:
    """ocrfleet's requirements without extras, as pyproject.toml names them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])


def base_distributions() -> list[metadata.Distribution]:
    """Everything ocrfleet's requirements without extras need, as installed here."""
    found: dict[str, metadata.Distribution] = {}
    todo = _needed(base_requirements())
    while todo:
        name = _normalise(todo.pop())
        if name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError as exc:
            raise VenvUnavailable(f"{name} is not installed in {sys.prefix}") from exc
        found[name] = dist
        todo += _needed(dist.requires or [])
    return list(found.values())


def _needed(requirements: list[str]) -> list[str]:
    """The names of `requirements` that apply here without extras."""
    parsed = [Requirement(text) for text in requirements]
    return [r.name for r in parsed if r.marker is None or r.marker.evaluate({"extra": ""})]


def _top_level(dist: metadata.Distribution) -> set[str]:
    """The entries of site-packages that belong to `dist` (packages, modules, its
    dist-info); scripts and data outside site-packages are left out."""
    entries = set()
    for file in dist.files or []:
        parts = Path(file).parts
        if parts and parts[0] != ".." and not parts[0].endswith(".pth"):
            entries.add(parts[0])
    return entries


def build(target: Path) -> Path:
    """The venv at `target` (made once); returns its python."""
    python = target / "bin" / "python"
    if python.exists():
        return python
    distributions = base_distributions()
    names = {_normalise(d.name) for d in distributions}
    leaked = sorted(names & set(MODELS_EXTRA))
    if leaked:
        raise VenvUnavailable(f"ocrfleet's base requirements pull in {leaked}")
    subprocess.run(
        [sys._base_executable, "-m", "venv", "--without-pip", str(target)],  # noqa: SLF001
        check=True,
        capture_output=True,
    )
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    for dist in distributions:
        source = Path(dist.locate_file(""))
        for entry in _top_level(dist):
            if (source / entry).exists() and not (site / entry).exists():
                (site / entry).symlink_to(source / entry)
    return python
