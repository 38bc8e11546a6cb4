"""Device discovery, `--devices` parsing and the launcher's plan of children (no services)."""

from __future__ import annotations

import shutil

import pytest

from ocrfleet.tasks import routing
from ocrfleet.tasks.devices import (
    Device,
    DeviceSpecError,
    discover_cuda,
    parse_devices,
    parse_nvidia_smi,
    thread_share,
)
from ocrfleet.tasks.launcher import plan_children

NVIDIA_SMI_L = """GPU 0: NVIDIA H200 (UUID: GPU-0c1e0d2a-3b4c-5d6e-7f80-91a2b3c4d5e6)
GPU 1: NVIDIA H200 (UUID: GPU-1d2e3f40-5162-7384-95a6-b7c8d9e0f1a2)
  MIG 1g.18gb     Device  0: (UUID: MIG-2f3e4d5c-6b7a-8990-a1b2-c3d4e5f60718)
GPU 3: NVIDIA H200 (UUID: GPU-3a4b5c6d-7e8f-9012-3456-789abcdef012)
"""


@pytest.fixture(autouse=True)
def _no_inherited_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_parse_nvidia_smi_reads_gpu_lines_only() -> None:
    assert parse_nvidia_smi(NVIDIA_SMI_L) == [0, 1, 3]
    assert parse_nvidia_smi("") == []
    assert parse_nvidia_smi("No devices were found\n") == []


def test_cpu_slots() -> None:
    devices = parse_devices("cpu:3", discover=lambda: 8)
    assert [d.name for d in devices] == ["cpu0", "cpu1", "cpu2"]
    assert all(d.env == {"CUDA_VISIBLE_DEVICES": ""} for d in devices)
    assert parse_devices("cpu", discover=lambda: 0) == [Device("cpu", 0)]
    for bad in ("cpu:0", "cpu:x", "cpu:-1"):
        with pytest.raises(DeviceSpecError):
            parse_devices(bad, discover=lambda: 0)


def test_auto_and_all() -> None:
    gpus = parse_devices("auto", discover=lambda: 2)
    assert [(d.name, d.env["CUDA_VISIBLE_DEVICES"]) for d in gpus] == [("gpu0", "0"), ("gpu1", "1")]
    assert parse_devices("all", discover=lambda: 2) == gpus
    assert parse_devices("auto", discover=lambda: 0) == [Device("cpu", 0)]
    with pytest.raises(DeviceSpecError, match="no CUDA device"):
        parse_devices("all", discover=lambda: 0)


def test_explicit_indices() -> None:
    devices = parse_devices("0,2", discover=lambda: 4)
    assert [(d.name, d.visible_id) for d in devices] == [("gpu0", "0"), ("gpu2", "2")]
    with pytest.raises(DeviceSpecError, match=r"no device \[5\]"):
        parse_devices("0,5", discover=lambda: 4)
    # Without any GPU found the indices are taken as given (the launcher test relies on it).
    assert [d.visible_id for d in parse_devices("0,1", discover=lambda: 0)] == ["0", "1"]
    for bad in ("0,0", "a,b", "1;2", ""):
        with pytest.raises(DeviceSpecError):
            parse_devices(bad, discover=lambda: 4)


def test_inherited_visible_devices_map_to_physical_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    devices = parse_devices("auto", discover=lambda: 2)
    assert [(d.name, d.visible_id) for d in devices] == [("gpu0", "3"), ("gpu1", "5")]
    assert [d.visible_id for d in parse_devices("1", discover=lambda: 2)] == ["5"]


def test_discover_cuda_agrees_with_the_machine() -> None:
    count = discover_cuda()
    assert count >= 0
    if shutil.which("nvidia-smi") is None:
        try:
            import torch
        except ImportError:
            assert count == 0
        else:
            assert count == torch.cuda.device_count()


def test_thread_share_splits_cores_between_cpu_slots() -> None:
    assert thread_share(parse_devices("cpu:2", discover=lambda: 0), cpu_count=8) == 4
    assert thread_share(parse_devices("cpu:4", discover=lambda: 0), cpu_count=2) == 1


def test_consume_order_puts_every_high_queue_first() -> None:
    assert routing.consume_order(["gpu"]) == ["gpu.high", "gpu"]
    assert routing.consume_order(["gpu", "ingest"]) == ["gpu.high", "ingest.high", "gpu", "ingest"]
    assert routing.consume_order(["ingest"]) == ["ingest.high", "ingest"]
    with pytest.raises(ValueError):
        routing.consume_order(["cpu"])
    assert routing.page_queue("high") == "gpu.high"
    assert routing.ingest_queue("normal") == "ingest"
    with pytest.raises(ValueError):
        routing.page_queue("urgent")


def test_plan_one_pinned_child_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    devices = parse_devices("0,1", discover=lambda: 2)
    children = plan_children(["gpu"], devices, include=["my.hooks"], events=True)
    assert [c.name for c in children] == ["gpu0", "gpu1"]
    for child, visible in zip(children, ["0", "1"], strict=True):
        argv = child.argv
        assert child.env == {"CUDA_VISIBLE_DEVICES": visible}
        assert argv[argv.index("--hostname") + 1] == f"{child.name}@%h"
        assert argv[argv.index("--queues") + 1] == "gpu.high,gpu"
        assert argv[argv.index("--concurrency") + 1] == "1"
        assert argv[argv.index("--pool") + 1] == "prefork"
        assert argv[argv.index("--include") + 1] == "my.hooks"
        assert "--task-events" in argv
    cpu = plan_children(["gpu", "ingest"], parse_devices("cpu:2", discover=lambda: 0))
    assert [c.env["CUDA_VISIBLE_DEVICES"] for c in cpu] == ["", ""]
    assert all("OMP_NUM_THREADS" in c.env for c in cpu)


def test_plan_ingest_only_is_one_cpu_pool() -> None:
    (child,) = plan_children(["ingest"], [], concurrency=3)
    assert child.name == "ingest"
    assert child.env == {"CUDA_VISIBLE_DEVICES": ""}
    assert child.argv[child.argv.index("--concurrency") + 1] == "3"
    assert child.argv[child.argv.index("--queues") + 1] == "ingest.high,ingest"


def test_supervisor_gives_up_on_a_child_that_keeps_dying() -> None:
    """A worker that exits right after every start (say, a missing model path) stops the
    launcher with a non-zero status instead of a restart loop forever."""
    import sys

    from ocrfleet.tasks.launcher import ChildSpec, Supervisor

    crash = ChildSpec("cpu0", [sys.executable, "-c", "raise SystemExit(78)"], {})
    supervisor = Supervisor(
        [crash],
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
        stable_after_s=30,
        max_failures_in_a_row=3,
    )
    assert supervisor.run() == 1
    assert supervisor.children[0].restarts == 2
