"""Which devices a launcher pins its workers to.

One worker process per device, each seeing exactly that device through
`CUDA_VISIBLE_DEVICES`, so a process can never touch (or allocate on) a GPU it was not
given. Discovery never creates a CUDA context in the launcher's children: they are started
with fork+exec, and the launcher itself only counts devices.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger(__name__)

_NVIDIA_SMI_LINE = re.compile(r"^GPU (\d+): ")


class DeviceSpecError(ValueError):
    """A `--devices` value that names nothing usable."""


@dataclass(frozen=True)
class Device:
    """One slot for one worker process: a CUDA device, or a CPU-only slot."""

    kind: Literal["cuda", "cpu"]
    index: int  # CUDA: the launcher's logical index; CPU: 0..N-1
    visible_id: str = ""  # what the child's CUDA_VISIBLE_DEVICES holds ("" for CPU)

    @property
    def name(self) -> str:
        return f"gpu{self.index}" if self.kind == "cuda" else f"cpu{self.index}"

    @property
    def env(self) -> dict[str, str]:
        """Environment overrides for the worker pinned to this device."""
        return {"CUDA_VISIBLE_DEVICES": self.visible_id}


def parse_nvidia_smi(output: str) -> list[int]:
    """Device indices from `nvidia-smi -L` ("GPU 0: NVIDIA H200 (UUID: ...)")."""
    return [int(m.group(1)) for line in output.splitlines() if (m := _NVIDIA_SMI_LINE.match(line))]


def _count_with_torch() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    try:
        return int(torch.cuda.device_count())
    except Exception as exc:  # a broken driver must not stop a CPU-only start
        log.warning("torch could not count CUDA devices: %s", exc)
        return 0


def _count_with_nvidia_smi() -> int | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("nvidia-smi -L failed: %s", exc)
        return 0
    if done.returncode != 0:
        log.warning("nvidia-smi -L exited %s: %s", done.returncode, done.stderr.strip())
        return 0
    return len(parse_nvidia_smi(done.stdout))


def discover_cuda() -> int:
    """How many CUDA devices this process may use: torch if installed, else `nvidia-smi -L`,
    else none. Both honour an inherited CUDA_VISIBLE_DEVICES (nvidia-smi does not, so we
    apply it ourselves)."""
    count = _count_with_torch()
    if count is not None:
        return count
    count = _count_with_nvidia_smi()
    if count is None:
        return 0
    inherited = _inherited_visible()
    return count if inherited is None else min(count, len(inherited))


def _inherited_visible() -> list[str] | None:
    """The launcher's own CUDA_VISIBLE_DEVICES, as a list of ids; None when unset."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def _visible_id(index: int, inherited: list[str] | None) -> str:
    """Map a logical index to the id the child must see: if the launcher was itself limited
    to `2,3`, logical device 0 is physical `2`."""
    if inherited is None:
        return str(index)
    if index >= len(inherited):
        raise DeviceSpecError(
            f"device {index} is not visible: CUDA_VISIBLE_DEVICES={','.join(inherited)!r}"
        )
    return inherited[index]


def parse_devices(spec: str, discover: Callable[[], int] = discover_cuda) -> list[Device]:
    """Resolve a `--devices` value.

    - `auto`: every discovered GPU, or one CPU slot when there is none;
    - `all`: every discovered GPU, and an error when there is none;
    - `0,2`: those GPUs (when discovery finds GPUs, each index must exist; when it finds
      none, the indices are used as given, with a warning, so a launcher can be exercised
      on a machine without GPUs);
    - `cpu:N`: N workers without a GPU (`CUDA_VISIBLE_DEVICES` empty).
    """
    spec = spec.strip().lower()
    if not spec:
        raise DeviceSpecError("--devices is empty: use auto, all, 0,2 or cpu:N")
    if spec.startswith("cpu"):
        return _cpu_slots(spec)
    inherited = _inherited_visible()
    if spec in ("auto", "all"):
        count = discover()
        if count == 0:
            if spec == "all":
                raise DeviceSpecError("--devices all: no CUDA device found (torch, nvidia-smi)")
            log.warning("no CUDA device found; starting one CPU worker (--devices auto)")
            return [Device("cpu", 0)]
        return [Device("cuda", i, _visible_id(i, inherited)) for i in range(count)]
    indices = _parse_indices(spec)
    count = discover()
    if count == 0:
        log.warning("no CUDA device found; pinning workers to %s as asked", spec)
    else:
        missing = [i for i in indices if i >= count]
        if missing:
            raise DeviceSpecError(f"--devices {spec}: no device {missing}; found {count}")
    return [Device("cuda", i, _visible_id(i, inherited)) for i in indices]


def _cpu_slots(spec: str) -> list[Device]:
    _, _, count_text = spec.partition(":")
    try:
        count = int(count_text) if count_text else 1
    except ValueError:
        raise DeviceSpecError(f"--devices {spec}: expected cpu:N with N a number") from None
    if count < 1:
        raise DeviceSpecError(f"--devices {spec}: N must be at least 1")
    return [Device("cpu", i) for i in range(count)]


def _parse_indices(spec: str) -> list[int]:
    parts = [part.strip() for part in spec.split(",")]
    if not all(part.isdigit() for part in parts):
        raise DeviceSpecError(f"--devices {spec}: expected auto, all, cpu:N or indices like 0,2")
    indices = [int(part) for part in parts]
    if len(set(indices)) != len(indices):
        raise DeviceSpecError(f"--devices {spec}: a device is listed twice")
    return indices


def thread_share(devices: Sequence[Device], cpu_count: int | None = None) -> int:
    """CPU threads each CPU-slot worker may use, so N CPU workers do not oversubscribe."""
    cpus = cpu_count or os.cpu_count() or 1
    slots = sum(1 for device in devices if device.kind == "cpu") or 1
    return max(1, cpus // slots)


class StartupError(RuntimeError):
    """The worker cannot serve: a device is unusable or a model does not run."""


def device_report(device: str) -> dict[str, Any]:
    """Name and free memory of `device` ("cpu", "cuda", "cuda:N"); raises StartupError when
    it is not usable in this process."""
    if not device.startswith("cuda"):
        return {"device": device, "device_name": "cpu"}
    import torch

    if not torch.cuda.is_available():
        raise StartupError(f"device {device} is configured but CUDA is not available here")
    index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise StartupError(
            f"device {device} is configured but this process sees "
            f"{torch.cuda.device_count()} CUDA device(s)"
        )
    free, total = torch.cuda.mem_get_info(index)
    return {
        "device": f"cuda:{index}",
        "device_name": torch.cuda.get_device_name(index),
        "free_mib": free // 2**20,
        "total_mib": total // 2**20,
    }
