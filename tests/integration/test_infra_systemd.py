"""The fleet started by systemd from infra/systemd's own units processes a document.

A systemd user manager (the machine's /lib/systemd/systemd; PID 1 need not be systemd: the
manager runs in a mount namespace of its own where /run/systemd/system exists) loads the
units as shipped. Drop-ins change only what differs on this machine, the way an operator
adapts a unit: no `ocrfleet` user, the test's environment files instead of /etc/ocrfleet,
this venv's `ocrfleet` with the unit's own arguments, free ports, logs to files. The run is
pinned as the README says (`ocrfleet run-id` with the device workers' gpu.env), and the
document is submitted by a client that has only the shared environment file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import REPO, free_port, temporary_pg_database, wait_for_port

pytestmark = pytest.mark.integration

SYSTEMD = REPO / "infra" / "systemd"
MANAGER = Path("/lib/systemd/systemd")
OCRFLEET = Path(sys.executable).parent / "ocrfleet"
UNITS = ["ocrfleet-migrate.service", "ocrfleet-ingest.service", "ocrfleet-scheduler.service"]
UNITS += ["ocrfleet-api.service", "ocrfleet-gpu@0.service"]
DOCUMENT = REPO / "examples" / "memo.tif"


def _needs() -> str | None:
    if not MANAGER.exists() or not shutil.which("systemctl"):
        return "systemd is not installed"
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        return "a private mount namespace for the user manager needs root, unshare, nsenter"
    if not shutil.which("redis-server"):
        return "redis-server is not installed"
    return None


def drop_in(unit: Path, tmp: Path, ports: dict[str, int]) -> str:
    """The override of `unit` for this machine, keeping its own arguments."""
    body = unit.read_text()
    (exec_start,) = re.findall(r"^ExecStart=(.+)$", body, re.M)
    argv = exec_start.split()
    assert argv[0] == "/opt/ocrfleet/.venv/bin/ocrfleet", exec_start
    argv[0] = str(OCRFLEET)
    if "--port" in argv:
        argv[argv.index("--port") + 1] = str(ports["api"])
    lines = ["[Service]", "User=", "EnvironmentFile="]
    for path in re.findall(r"^EnvironmentFile=-?/etc/ocrfleet/(\S+)$", body, re.M):
        lines.append(f"EnvironmentFile={tmp / path}")
    if "OCRFLEET_WORKER_HEALTH_PORT" in body:
        lines.append(f"Environment=OCRFLEET_WORKER_HEALTH_PORT={ports[unit.stem]}")
    if "OCRFLEET_SCHEDULER_METRICS_PORT" in body:
        lines.append(f"Environment=OCRFLEET_SCHEDULER_METRICS_PORT={ports['scheduler']}")
    name = unit.stem.rstrip("@")
    lines += ["ExecStart=", f"ExecStart={' '.join(argv)}"]
    lines += [f"StandardOutput=append:{tmp / 'logs' / name}.log", "StandardError=inherit"]
    return "\n".join(lines) + "\n"


@contextmanager
def redis_server() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class UserManager:
    """systemd --user in a mount namespace of its own; `ctl` runs systemctl against it."""

    def __init__(self, tmp: Path) -> None:
        self.runtime = tmp / "runtime"
        self.runtime.mkdir(mode=0o700)
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(tmp),
            "XDG_RUNTIME_DIR": str(self.runtime),
            "XDG_CONFIG_HOME": str(tmp / "config"),
            "XDG_CACHE_HOME": str(tmp / "cache"),
        }
        script = "mount -t tmpfs tmpfs /run/systemd && mkdir /run/systemd/system && exec " + (
            f"{MANAGER} --user"
        )
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            env=self.env,
            stdout=open(tmp / "logs" / "manager.log", "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["nsenter", "-t", str(self.proc.pid), "-m", "systemctl", "--user", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def wait_ready(self, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            socket = self.runtime / "systemd" / "private"
            if socket.exists() and self.ctl("list-units", "--no-pager").returncode == 0:
                return True
            time.sleep(0.2)
        return False

    def close(self) -> None:
        if self.proc.poll() is None:
            stopped = self.ctl("stop", *UNITS[1:], "ocrfleet.target", timeout=120)
            if stopped.returncode != 0:
                self.ctl("kill", "--signal=SIGKILL", *UNITS[1:])
            self.ctl("exit")
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def http_get(url: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def logs(tmp: Path) -> str:
    return "\n".join(
        f"--- {path.name}\n{path.read_text(errors='replace')[-2500:]}"
        for path in sorted((tmp / "logs").glob("*.log"))
    )


def test_systemd_units_start_a_fleet_that_processes_a_document(tmp_path: Path) -> None:
    if reason := _needs():
        pytest.skip(reason)
    (tmp_path / "logs").mkdir()
    units = tmp_path / "config" / "systemd" / "user"
    units.mkdir(parents=True)
    ports = {"api": free_port(), "scheduler": free_port()}
    ports |= {"ocrfleet-ingest": free_port(), "ocrfleet-gpu@": free_port()}
    ports["ocrfleet-webhooks"] = free_port()
    for unit in [*SYSTEMD.glob("*.service"), *SYSTEMD.glob("*.target")]:
        shutil.copy(unit, units / unit.name)  # as shipped
        if unit.suffix == ".service":
            (units / f"{unit.name}.d").mkdir()
            (units / f"{unit.name}.d" / "here.conf").write_text(drop_in(unit, tmp_path, ports))

    with redis_server() as broker, temporary_pg_database("ocrfleet_systemd") as db:
        shared = {
            "OCRFLEET_DATABASE_URL": db,
            "OCRFLEET_BROKER_URL": broker,
            "OCRFLEET_STORE_URL": f"file://{tmp_path / 'store'}",
        }
        # The device workers' role: the CPU engine, and a threshold of their own, so every
        # other role must take the run from the pin (its own settings make another run).
        gpu = {"OCRFLEET_ENGINES": "rapidocr", "OCRFLEET_SCORER": "consensus"}
        gpu["OCRFLEET_THRESHOLD_TEXT"] = "0.9"
        write_env(tmp_path / "ocrfleet.env", shared)
        write_env(tmp_path / "gpu.env", gpu)
        base = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
        base["OCRFLEET_CACHE_DIR"] = str(tmp_path / "cache" / "ocrfleet")
        manager = UserManager(tmp_path)
        try:
            if not manager.wait_ready():
                pytest.skip(f"no systemd user manager here:\n{logs(tmp_path)}")
            started = manager.ctl("start", "ocrfleet-migrate.service", timeout=180)
            assert started.returncode == 0, started.stderr + logs(tmp_path)

            # README, "Pinning the run": the device workers' settings make it.
            pinned = subprocess.run(
                [str(OCRFLEET), "run-id", "--register"],
                env={**base, **shared, **gpu},
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert pinned.returncode == 0, pinned.stderr
            run_id = pinned.stdout.split()[0]
            own = subprocess.run(
                [str(OCRFLEET), "run-id"], env={**base, **shared}, capture_output=True, text=True
            )
            assert own.stdout.split()[0] != run_id  # without the pin, another run
            write_env(tmp_path / "ocrfleet.env", {**shared, "OCRFLEET_RUN_ID": run_id})

            started = manager.ctl("start", "ocrfleet.target", "ocrfleet-gpu@0.service")
            assert started.returncode == 0, started.stderr + logs(tmp_path)
            submitted = subprocess.run(
                [str(OCRFLEET), "submit", str(DOCUMENT), "--wait", "--timeout", "300"],
                env={**base, **shared, "OCRFLEET_RUN_ID": run_id},
                capture_output=True,
                text=True,
                timeout=360,
            )
            assert submitted.returncode == 0, submitted.stdout + submitted.stderr + logs(tmp_path)

            engine = create_engine(db)
            with engine.connect() as conn:
                docs = conn.execute(text("SELECT status, run_id FROM documents")).all()
                texts = conn.execute(text("SELECT count(*) FROM regions")).scalar_one()
            engine.dispose()
            assert [tuple(d) for d in docs] == [("done", run_id)]
            assert texts > 0

            # Every unit is running, and what Prometheus scrapes answers.
            for unit in UNITS[1:]:
                state = manager.ctl("is-active", unit).stdout.strip()
                assert state == "active", f"{unit}: {state}\n{logs(tmp_path)}"
            assert "ocrfleet_backlog" in http_get(f"http://127.0.0.1:{ports['scheduler']}/metrics")
            assert "ocrfleet_api" in http_get(f"http://127.0.0.1:{ports['api']}/metrics")
            worker = http_get(f"http://127.0.0.1:{ports['ocrfleet-gpu@']}/metrics")
            assert "ocrfleet_pages_processed_total" in worker
            http_get(f"http://127.0.0.1:{ports['ocrfleet-ingest']}/healthz")
        finally:
            manager.close()


def write_env(path: Path, values: dict[str, str]) -> None:
    path.write_text("".join(f"{key}={value}\n" for key, value in values.items()))
