"""Issue 18, findings 3, 4 and 5, and the `reviewed` event: webhooks against real
receivers on 127.0.0.1 (a socket server that drips its answer a byte at a time, an HTTP
server that records), real PostgreSQL and Redis, `ocrfleet worker` and `ocrfleet api` as
processes. Rebinding is shown with a resolver hook of our own: the one call that resolves a
callback host takes it, so the test sees every resolution the code makes."""

from __future__ import annotations

import json
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select as sql_select
from starlette.testclient import TestClient

from ocrfleet import client, webhooks
from ocrfleet.api import keys
from ocrfleet.config import Settings, get_settings
from ocrfleet.db.migrate import upgrade
from ocrfleet.db.models import Delivery, Document, Run
from ocrfleet.db.session import dispose_engines, session_scope
from ocrfleet.outbound import address_allowed
from ocrfleet.review.app import create_app as review_app
from ocrfleet.tasks import routing
from ocrfleet.tasks.launcher import plan_children
from tests.integration.fleet_helpers import (
    api_process,
    fleet_env,
    make_document,
    ocrfleet_cli,
    rows,
    scalar,
    settings_from,
    start_workers,
)
from tests.integration.review.conftest import review_db, world  # noqa: F401
from tests.integration.review.helpers import World, csrf_of, login, settings_for, version_of
from tests.unit.test_infra import all_processes

FLEET_SECRET = "fleet-secret-for-keyless-producers"
RUN = "r" * 64


# -- receivers -------------------------------------------------------------------------


@dataclass
class Recorder:
    """An HTTP server on 127.0.0.1 that records every POST and answers 204."""

    url: str
    calls: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    def wait(
        self, count: int, timeout: float = 60, log: Callable[[], str] = str
    ) -> list[tuple[dict[str, str], bytes]]:
        deadline = time.monotonic() + timeout
        while len(self.calls) < count:
            calls = len(self.calls)
            assert time.monotonic() < deadline, f"{calls} call(s) after {timeout}s\n{log()}"
            time.sleep(0.1)
        return list(self.calls)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    calls: list[tuple[dict[str, str], bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            calls.append((dict(self.headers), body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Recorder(f"http://127.0.0.1:{server.server_port}/hook", calls)
    server.shutdown()
    server.server_close()


class Drip:
    """A receiver that reads the request, then sends its answer one byte every `interval`
    seconds; records, per connection, how many bytes it had sent when the client hung up
    (None while it is still connected)."""

    def __init__(self, answer: bytes, interval: float) -> None:
        self.answer, self.interval = answer, interval
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.connections: list[int | None] = []
        self.connected = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            slot = len(self.connections)
            self.connections.append(None)
            threading.Thread(target=self._drip, args=(conn, slot), daemon=True).start()

    def _drip(self, conn: socket.socket, slot: int) -> None:
        with conn:
            request = b""
            conn.settimeout(10)
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(65536)
                if not chunk:
                    self.connections[slot] = 0
                    return
                request += chunk
            self.connected.set()
            for sent in range(1, len(self.answer) + 1):
                if self.stopping.is_set():
                    return
                conn.sendall(self.answer[sent - 1 : sent])
                readable, _, _ = select.select([conn], [], [], self.interval)
                if readable and not conn.recv(65536):
                    self.connections[slot] = sent  # the client hung up after `sent` bytes
                    return

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def drip() -> Iterator[Drip]:
    # A 200 whose status line alone takes a minute: `HTTP/1.1 200 OK…`, a byte per 0.5 s.
    server = Drip(b"HTTP/1.1 200 " + b"O" * 120 + b"\r\n\r\n", interval=0.5)
    yield server
    server.close()


# -- services ----------------------------------------------------------------------------


@pytest.fixture
def fleet(pg_url: str, redis_url: str, s3_bucket: str, moto_endpoint: str) -> Iterator[dict]:
    """OCRFLEET_* variables for workers, the API and clients on a migrated PostgreSQL, Redis
    and moto's S3 (as tests/integration's `env`)."""
    upgrade(pg_url)
    yield fleet_env(
        pg_url=pg_url,
        broker_url=redis_url,
        bucket=s3_bucket,
        moto_endpoint=moto_endpoint,
        OCRFLEET_WEBHOOK_SECRET=FLEET_SECRET,
    )
    dispose_engines()




@pytest.fixture
def db(pg_url: str) -> Iterator[str]:
    upgrade(pg_url)
    with session_scope(pg_url) as session:
        session.add(Run(id=RUN, config={}))
    yield pg_url
    dispose_engines()


def hooks(url: str, **extra: object) -> Settings:
    values: dict[str, object] = {"webhook_secret": FLEET_SECRET, "webhook_backoff_s": 0.1}
    return Settings(_env_file=None, database_url=url, **{**values, **extra})  # type: ignore[arg-type]


def finished(url: str, callback_url: str, key_id: int | None = None, tenant: str = "") -> int:
    """A document done, with a callback, claimed for its completion webhook."""
    with session_scope(url) as session:
        doc = Document(
            run_id=RUN,
            sha256=f"{time.monotonic_ns():064x}"[-64:],
            tenant=tenant,
            source_uri="intake/x",
            status="done",
            page_count=1,
            pages_done=1,
            callback_url=callback_url,
            webhook_key_id=key_id,
        )
        session.add(doc)
        session.flush()
        assert webhooks.claim(session, doc.id)
        return doc.id


# -- finding 3: one deadline per delivery, its own queue ----------------------------------


@pytest.mark.finding(
    3,
    before="a receiver dripping its answer held the delivery 90 s with a 10 s timeout",
    after="the attempt ends at its one deadline (resolve+connect+TLS+send+status line)",
)
def test_a_dripping_receiver_is_cut_off_at_the_deadline(db: str, drip: Drip) -> None:
    settings = hooks(db, webhook_allow_private=True, webhook_timeout_s=1.5)
    doc_id = finished(db, drip.url)
    outcome = webhooks.deliver(settings, doc_id)
    # A per-read timeout never fires on a byte every 0.5 s: the old client read all 129
    # bytes (a minute) and called it delivered. The deadline hangs up part-way through.
    assert not outcome.delivered and not outcome.final
    assert outcome.error is not None and outcome.error.startswith("DeadlineExceeded")
    deadline = time.monotonic() + 10
    while not drip.connections or drip.connections[0] is None:
        assert time.monotonic() < deadline, "the client never hung up"
        time.sleep(0.05)
    assert 0 < drip.connections[0] < len(drip.answer)
    with session_scope(db) as session:
        (row,) = session.scalars(sql_select(Delivery)).all()
        assert (row.attempt, row.status_code) == (1, None)
        assert row.error.startswith("DeadlineExceeded")


@pytest.mark.finding(
    3,
    before="a resolver or a receiver that never answers held the attempt without bound",
    after="both end at the same deadline",
)
def test_a_hanging_resolver_or_silent_receiver_ends_at_the_deadline(db: str) -> None:
    settings = hooks(db, webhook_allow_private=True, webhook_timeout_s=1.0)
    hung = threading.Event()

    def stuck(host: str, port: int) -> list[str]:
        hung.wait(30)  # a DNS server that never answers
        return ["127.0.0.1"]

    outcome = webhooks.deliver(settings, finished(db, "http://hook.example/x"), resolver=stuck)
    hung.set()
    assert outcome.error is not None and outcome.error.startswith("DeadlineExceeded")

    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (backlog), never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/x"
        outcome = webhooks.deliver(settings, finished(db, url))
    assert outcome.error is not None and outcome.error.startswith("DeadlineExceeded")


@pytest.mark.finding(
    3,
    before="deliveries ran on ingest.high: every ingest worker and deployment took them",
    after="queue `webhooks`, consumed only by a threads child every ingest launcher starts",
)
def test_deliveries_have_a_queue_and_a_worker_child_of_their_own() -> None:
    assert routing.TASK_ROUTES[routing.WEBHOOK_TASK] == {"queue": routing.WEBHOOK_QUEUE}
    assert routing.WEBHOOK_QUEUE in {q.name for q in routing.task_queues()}
    ingest, hooks_child = plan_children(["ingest"], [], concurrency=2, webhook_threads=4)
    queues = {c.name: c.argv[c.argv.index("--queues") + 1] for c in (ingest, hooks_child)}
    assert queues == {"ingest": "ingest.high,ingest", "webhooks": "webhooks"}
    assert hooks_child.argv[hooks_child.argv.index("--pool") + 1] == "threads"
    assert [c.name for c in plan_children(["webhooks"], [], webhook_threads=2)] == ["webhooks"]
    # infra/ starts delivery workers in every form: compose and Kubernetes through their
    # ingest launchers, systemd with a unit of its own.
    roles = {
        p.where: (p.option("--queues") or "").split(",")
        for p in all_processes()
        if p.argv[0] == "worker"
    }
    delivering = {where for where, r in roles.items() if "ingest" in r or "webhooks" in r}
    assert delivering >= {
        "compose ingest",
        "Deployment ocrfleet-ingest",
        "ocrfleet-webhooks.service",
    }, roles


@pytest.mark.finding(
    3,
    before="a high-priority upload waited behind a slow delivery on the ingest worker",
    after="it is split while the slow delivery is still in flight",
)
def test_a_slow_delivery_never_delays_an_upload(fleet: dict[str, str], tmp_path: Path) -> None:
    slow = Drip(b"HTTP/1.1 200 " + b"O" * 600 + b"\r\n\r\n", interval=1.0)  # ten minutes
    env = {
        **fleet,
        "OCRFLEET_WEBHOOK_ALLOW_PRIVATE": "true",
        "OCRFLEET_WEBHOOK_TIMEOUT_S": "600",
    }
    settings = settings_from(env)
    # One ingest process: before, the delivery would have occupied it.
    workers = start_workers(env, tmp_path / "workers.log", queues="ingest", concurrency=1)
    try:
        hooked = client.submit(b"not a document", callback_url=slow.url, settings=settings)
        assert slow.connected.wait(180), workers.log_tail()  # the delivery is dripping
        upload = client.submit(make_document(3, 1), priority="high", settings=settings)
        deadline = time.monotonic() + 180
        while client.status(upload, settings=settings).page_count is None:
            assert time.monotonic() < deadline, workers.log_tail()
            time.sleep(0.2)
        assert slow.connections == [None]  # split while the delivery still waits
        assert client.status(hooked, settings=settings).status.value == "rejected"
        url = env["OCRFLEET_DATABASE_URL"]
        assert scalar(url, "SELECT count(*) FROM deliveries") == 0  # still in flight
    finally:
        slow.close()
        workers.stop()


# -- finding 4: resolve once, every special-purpose range, "not allowed" -------------------

REFUSED = [
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b:1::a00:1",  # local-use NAT64
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:c0a8:1::1",  # 6to4 of 192.168.0.1
    "::127.0.0.1",  # IPv4-compatible
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:169.254.169.254",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
    "192.0.0.192",
    "192.0.0.8",
    "100.64.0.1",  # carrier-grade NAT
    "198.18.0.1",  # benchmarking
    "240.0.0.1",
    "255.255.255.255",
    "224.0.0.1",
    "169.254.169.254",
    "0.0.0.0",
    "::",
    "::1",
    "fe80::1",
    "fc00::1",
    "ff02::1",
    "2001:db8::1",
    "100::1",
]


@pytest.mark.finding(
    4,
    before="check_url accepted 64:ff9b::/96, 2002::/16, ::127.0.0.1 and 192.0.0.192",
    after="every IANA special-purpose range (v4 and v6, NAT64/6to4/Teredo/mapped) refused",
)
@pytest.mark.parametrize("address", REFUSED)
def test_every_special_purpose_address_is_refused_without_naming_it(address: str) -> None:
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(webhooks.UnsafeCallbackURL) as refused:
        webhooks.check_url(f"http://{host}:8080/hook", allow_private=False)
    assert "not allowed" in str(refused.value)
    assert address not in str(refused.value)


def test_public_addresses_and_their_mapped_forms_are_allowed() -> None:
    import ipaddress

    for address in ("93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "::ffff:8.8.8.8"):
        assert address_allowed(ipaddress.ip_address(address)), address
    for spelled in ("http://2130706433/", "http://0177.0.0.1/", "http://0x7f.1/"):  # 127.0.0.1
        with pytest.raises(webhooks.UnsafeCallbackURL, match="not allowed"):
            webhooks.check_url(spelled, allow_private=False)


@pytest.mark.finding(
    4,
    before="the host was checked, then resolved again to connect: rebinding reached loopback",
    after="one resolution per attempt; the checked address is the one connected",
)
def test_rebinding_cannot_reach_loopback(db: str, recorder: Recorder) -> None:
    port = int(recorder.url.split(":")[2].split("/")[0])
    answers = iter([["93.184.216.34"], ["127.0.0.1"], ["127.0.0.1"], ["127.0.0.1"]])
    asked: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:  # public first, loopback after
        asked.append(host)
        return next(answers)

    settings = hooks(db, webhook_timeout_s=1.0)
    doc_id = finished(db, f"http://rebind.example:{port}/hook")
    outcome = webhooks.deliver(settings, doc_id, resolver=rebinding)
    assert asked == ["rebind.example"]  # resolved once, never again to connect
    assert recorder.calls == []  # the loopback receiver got nothing
    assert not outcome.delivered and outcome.error is not None
    assert "127.0.0.1" not in outcome.error

    # The next attempt resolves afresh, sees loopback, and refuses it for good.
    outcome = webhooks.deliver(settings, doc_id, resolver=rebinding)
    assert asked == ["rebind.example"] * 2 and recorder.calls == []
    assert outcome.final and outcome.error is not None and "not allowed" in outcome.error
    assert "127.0.0.1" not in outcome.error

    # A mix of public and private answers is refused whole.
    mixed = finished(db, f"http://mixed.example:{port}/hook")
    outcome = webhooks.deliver(
        settings, mixed, resolver=lambda host, port: ["93.184.216.34", "10.0.0.7"]
    )
    assert outcome.final and "not allowed" in (outcome.error or "") and recorder.calls == []


def test_the_checked_address_is_connected_with_the_name_kept(db: str, recorder: Recorder) -> None:
    """Allowed private addresses (development) go the same way: resolved once, connected by
    address, the Host header naming the URL's host."""
    port = int(recorder.url.split(":")[2].split("/")[0])
    asked: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]

    settings = hooks(db, webhook_allow_private=True)
    doc_id = finished(db, f"http://receiver.example:{port}/hook?x=1")
    outcome = webhooks.deliver(settings, doc_id, resolver=resolver)
    assert outcome.delivered and asked == ["receiver.example"]
    ((headers, body),) = recorder.calls
    assert headers["Host"] == f"receiver.example:{port}"
    assert json.loads(body)["id"] == doc_id


def self_signed(name: str, folder: Path) -> tuple[Path, Path]:
    """(certificate, key) files of a self-signed certificate for DNS name `name`."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_tls_to_the_checked_address_verifies_the_name(tmp_path: Path) -> None:
    """Connected by address, TLS still sends the URL's name (SNI) and checks the
    certificate against it: a receiver with another name's certificate is refused."""
    import ssl

    from ocrfleet import outbound

    cert, key = self_signed("receiver.example", tmp_path)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    names: list[str | None] = []
    server.sni_callback = lambda sock, name, ctx: names.append(name)  # type: ignore[assignment]
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            try:
                with server.wrap_socket(conn, server_side=True) as tls:
                    request = b""
                    while b"\r\n\r\n" not in request:
                        request += tls.recv(65536)
                    tls.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
            except (ssl.SSLError, OSError):
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    trusting = ssl.create_default_context(cafile=str(cert))
    deadline = time.monotonic() + 10
    target = outbound.Target("https", "receiver.example", port, "/hook", ("127.0.0.1",))
    assert outbound.post(target, b"{}", {}, deadline=deadline, tls=trusting) == 204
    assert names == ["receiver.example"]
    wrong = outbound.Target("https", "other.example", port, "/hook", ("127.0.0.1",))
    with pytest.raises(ssl.SSLCertVerificationError):
        outbound.post(wrong, b"{}", {}, deadline=deadline, tls=trusting)
    thread.join(timeout=10)
    listener.close()


@pytest.mark.finding(
    4,
    before="the API's 422 said what the callback host resolved to",
    after='422 "not allowed", no address',
)
def test_the_api_refusal_says_not_allowed_and_no_address(
    fleet: dict[str, str], tmp_path: Path
) -> None:
    env = fleet
    with session_scope(env["OCRFLEET_DATABASE_URL"]) as session:
        _, key = keys.add_key(session, "acme")
    with api_process(env, tmp_path / "api.log") as base:
        http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        for callback in ("http://localhost:9/hook", "http://[64:ff9b::7f00:1]/hook"):
            refused = http.post(
                "/v1/documents",
                files={"file": ("x.pdf", make_document(5, 1), "application/pdf")},
                data={"callback_url": callback},
            )
            assert refused.status_code == 422, refused.text
            assert "not allowed" in refused.text
            assert not re.search(r"127\.0\.0\.1|::1\b|7f00", refused.text), refused.text
        assert scalar(env["OCRFLEET_DATABASE_URL"], "SELECT count(*) FROM documents") == 0


# -- finding 5: a secret per API key, kid in the header, rotation -------------------------


def secret_of(url: str, key_id: int) -> str | None:
    with session_scope(url) as session:
        return keys.webhook_secret(session, key_id)


@pytest.mark.finding(
    5,
    before="one secret for all tenants: A's forged body verified at B's receiver",
    after="a secret per API key (kid in the header); A's signature fails at B's receiver",
)
def test_each_key_signs_with_its_own_secret(db: str, recorder: Recorder) -> None:
    env = {"OCRFLEET_DATABASE_URL": db}
    ocrfleet_cli(env, "keys", "add", "A")  # the command, as an operator runs it
    with session_scope(db) as session:
        keys.add_key(session, "B")
    ids = dict(rows(db, "SELECT tenant, id FROM api_keys"))
    secrets = {
        "A": ocrfleet_cli(env, "keys", "webhook-secret", str(ids["A"])).strip(),
        "B": secret_of(db, ids["B"]),
    }
    assert secrets["A"] == secret_of(db, ids["A"]) and secrets["A"] != secrets["B"]

    settings = hooks(db, webhook_allow_private=True)
    for tenant in ("A", "B"):
        doc_id = finished(db, recorder.url, key_id=ids[tenant], tenant=tenant)
        assert webhooks.deliver(settings, doc_id).delivered
    received = {}
    for headers, body in recorder.calls:
        signature = headers[webhooks.SIGNATURE_HEADER]
        assert re.fullmatch(r"t=\d+,kid=\d+,v1=[0-9a-f]{64}", signature), signature
        tenant = {str(v): k for k, v in ids.items()}[webhooks.key_id_of(signature)]
        received[tenant] = (signature, body)
        assert webhooks.verify(secrets[tenant], signature, body)
        assert not webhooks.verify(FLEET_SECRET, signature, body)
    assert set(received) == {"A", "B"}

    # Tenant A forges a body for B's receiver, results pointing at its own host, signed
    # with the only secret it has: B's receiver, verifying with B's secret, refuses it.
    forged = json.loads(received["B"][1])
    forged["results"] = {"text": "https://attacker.example/steal"}
    forged_body = json.dumps(forged, sort_keys=True).encode()
    for kid in (str(ids["A"]), str(ids["B"])):
        header = webhooks.sign(secrets["A"], forged_body, key_id=kid)
        assert not webhooks.verify(secrets["B"], header, forged_body)

    # Rotation: B's next callback verifies with the new secret only.
    rotated = ocrfleet_cli(env, "keys", "rotate-webhook-secret", str(ids["B"])).strip()
    assert rotated not in secrets.values() and secret_of(db, ids["B"]) == rotated
    doc_id = finished(db, recorder.url, key_id=ids["B"], tenant="B")
    assert webhooks.deliver(settings, doc_id).delivered
    headers, body = recorder.calls[-1]
    assert webhooks.verify(rotated, headers[webhooks.SIGNATURE_HEADER], body)
    assert not webhooks.verify(secrets["B"], headers[webhooks.SIGNATURE_HEADER], body)
    with session_scope(db) as session:
        assert keys.rotate_webhook_secret(session, 999) is None


@pytest.mark.finding(
    5,
    before="OCRFLEET_WEBHOOK_SECRET signed every tenant's callbacks",
    after="it signs only documents submitted without an API key (kid=fleet)",
)
def test_the_fleet_secret_signs_only_keyless_documents(db: str, recorder: Recorder) -> None:
    settings = hooks(db, webhook_allow_private=True)
    assert webhooks.deliver(settings, finished(db, recorder.url)).delivered
    headers, body = recorder.calls[-1]
    signature = headers[webhooks.SIGNATURE_HEADER]
    assert webhooks.key_id_of(signature) == webhooks.FLEET_KEY_ID
    assert webhooks.verify(FLEET_SECRET, signature, body)
    # Without a fleet secret a keyless callback is refused, never sent unsigned.
    outcome = webhooks.deliver(
        hooks(db, webhook_allow_private=True, webhook_secret=None), finished(db, recorder.url)
    )
    assert outcome.final and "refused" in (outcome.error or "") and len(recorder.calls) == 1


# -- the `reviewed` event ------------------------------------------------------------------


def test_a_review_that_changes_text_sends_a_reviewed_event(
    review_db: str,  # noqa: F811 - the fixture imported above
    world: World,  # noqa: F811
    redis_url: str,
    recorder: Recorder,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the review app and a real `webhooks` worker: a correction sends one signed
    `reviewed` event; accepting the reading already chosen changes no text and sends none."""
    document_id = world.documents["photo.jpg"]
    with session_scope(review_db) as session:
        session.get(Document, document_id).callback_url = recorder.url
    env = {
        "OCRFLEET_DATABASE_URL": review_db,
        "OCRFLEET_BROKER_URL": redis_url,
        "OCRFLEET_WEBHOOK_SECRET": FLEET_SECRET,
        "OCRFLEET_WEBHOOK_ALLOW_PRIVATE": "true",
    }
    for name, value in env.items():  # the process settings the review app sends with
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()  # read once per process: read it again, with these
    workers = start_workers(env, tmp_path / "webhooks.log", queues="webhooks")
    try:
        app = TestClient(review_app(settings_for(review_db, world)))
        login(app, "alice")
        regions = open_flagged(review_db, document_id)
        assert len(regions) >= 3, "the example should flag at least three regions"
        corrected, unchanged, again = regions[:3]
        assert decide(app, corrected, action="correct", text="Reviewed text 1") == 303
        assert scalar(review_db, "SELECT final_text FROM reviews") == "Reviewed text 1"
        ((headers, body),) = recorder.wait(1, timeout=120, log=workers.log_tail)
        event = json.loads(body)
        first_review = review_id_of(review_db, corrected)
        assert (event["event"], event["id"], event["review"]) == (
            "reviewed",
            document_id,
            {"id": first_review},
        )
        assert event["delivery"] == f"{document_id}-reviewed-{first_review}"
        signature = headers[webhooks.SIGNATURE_HEADER]
        assert webhooks.key_id_of(signature) == "fleet"
        assert webhooks.verify(FLEET_SECRET, signature, body)

        assert decide(app, unchanged, action=f"accept:{chosen_of(review_db, unchanged)}") == 303
        assert decide(app, again, action="correct", text="Reviewed text 2") == 303
        calls = recorder.wait(2, timeout=120, log=workers.log_tail)
        time.sleep(1.0)  # a stray event for the accept would have been sent by now too
        assert len(recorder.calls) == 2
        assert json.loads(calls[1][1])["review"] == {"id": review_id_of(review_db, again)}
    finally:
        workers.stop()
        get_settings.cache_clear()  # the next reader sees the environment restored


def open_flagged(url: str, document_id: int) -> list[int]:
    return [
        int(r)
        for (r,) in rows(
            url,
            "SELECT f.region_id FROM review_flags f JOIN regions r ON r.id = f.region_id "
            "JOIN pages p ON p.id = r.page_id WHERE p.document_id = :d AND f.status = 'open' "
            "AND r.chosen_engine IS NOT NULL ORDER BY f.id",
            d=document_id,
        )
    ]


def chosen_of(url: str, region_id: int) -> str:
    return str(scalar(url, "SELECT chosen_engine FROM regions WHERE id = :r", r=region_id))


def review_id_of(url: str, region_id: int) -> int:
    return int(scalar(url, "SELECT max(id) FROM reviews WHERE region_id = :r", r=region_id))


def decide(app: TestClient, region_id: int, **form: str) -> int:
    page = app.get(f"/regions/{region_id}")
    assert page.status_code == 200, page.text
    response = app.post(
        f"/regions/{region_id}/review",
        data={"csrf": csrf_of(page.text), "version": version_of(page.text), **form},
        follow_redirects=False,
    )
    return response.status_code
