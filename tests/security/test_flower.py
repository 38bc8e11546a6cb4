"""Finding 10: Flower, as `ocrfleet flower` starts it (a real process on real Redis).
Credentials without a password are refused before Flower starts; `/metrics` and
`/healthcheck` answer only with the credentials; it listens on 127.0.0.1 unless told."""

from __future__ import annotations

import base64
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port, wait_for_port
from tests.integration.fleet_helpers import process_env

CREDENTIALS = "ops:correct-horse"
FLOWER = [sys.executable, "-m", "ocrfleet.cli", "flower"]


def get(url: str, auth: str | None = None) -> int:
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code


def listening_addresses(port: int) -> set[str]:
    """The IPv4 addresses a socket listens on at `port`, from /proc/net/tcp."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            found.add(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


@pytest.fixture
def flower(redis_url: str, tmp_path: Path) -> Iterator[str]:
    """`ocrfleet flower` with basic auth and no --address; yields its base URL."""
    port = free_port()
    env = {
        "OCRFLEET_BROKER_URL": redis_url,
        "OCRFLEET_FLOWER_BASIC_AUTH": CREDENTIALS,
        "OCRFLEET_FLOWER_DB": str(tmp_path / "flower.db"),
    }
    with (tmp_path / "flower.log").open("ab") as log:
        proc = subprocess.Popen(
            [*FLOWER, "--port", str(port)],
            cwd=tmp_path,
            env=process_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port(port, timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.finding(
    10,
    before="OCRFLEET_FLOWER_BASIC_AUTH=ops accepted; a passwordless header got in",
    after="exit 2: entry is not user:password (value not echoed); Flower never starts",
)
@pytest.mark.parametrize("value", ["ops", "ops:", ":secret", f"{CREDENTIALS},admin"])
def test_credentials_without_a_password_are_refused(
    value: str, redis_url: str, tmp_path: Path
) -> None:
    env = {
        "OCRFLEET_BROKER_URL": redis_url,
        "OCRFLEET_FLOWER_BASIC_AUTH": value,
        "OCRFLEET_FLOWER_DB": str(tmp_path / "flower.db"),
    }
    done = subprocess.run(
        [*FLOWER, "--port", str(free_port())],
        cwd=tmp_path,
        env=process_env(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "is not user:password" in done.stderr
    assert "correct-horse" not in done.stderr
    assert not (tmp_path / "flower.db").exists()


@pytest.mark.finding(
    10,
    before="/metrics and /healthcheck answered anyone; Flower listened on 0.0.0.0",
    after="/metrics and /healthcheck 401 without the credentials; listens on 127.0.0.1",
)
def test_metrics_and_healthcheck_need_credentials_and_it_listens_on_loopback(
    flower: str,
) -> None:
    user = CREDENTIALS.split(":")[0]
    for path in ("/metrics", "/healthcheck", "/api/workers"):
        assert get(f"{flower}{path}") == 401, path
        assert get(f"{flower}{path}", user) == 401, path  # the header without a password
        assert get(f"{flower}{path}", f"{user}:") == 401, path
        assert get(f"{flower}{path}", "ops:wrong") == 401, path
        assert get(f"{flower}{path}", CREDENTIALS) == 200, path
    port = int(flower.rsplit(":", 1)[1])
    assert listening_addresses(port) == {"127.0.0.1"}
