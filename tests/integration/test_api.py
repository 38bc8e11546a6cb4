"""The HTTP API end to end: `ocrfleet api` and `ocrfleet worker` as processes on real Redis,
PostgreSQL and moto's S3; a local HTTP server receives the webhooks."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from lxml import etree

from ocrfleet import client, webhooks
from ocrfleet.scheduler.signals import database_signals
from ocrfleet.storage import open_store
from tests.integration.fleet_helpers import (
    Workers,
    api_process,
    make_document,
    ocrfleet_cli,
    page_lines,
    queue_depths,
    rows,
    scalar,
    settings_from,
    start_workers,
)

pytestmark = pytest.mark.integration

SECRET = "test-webhook-secret"
UPLOAD_LIMIT = 300_000


@dataclass
class Receiver:
    """Webhook receiver on 127.0.0.1: answers 500 to the first POST, 200 after."""

    url: str
    calls: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    def wait(self, count: int, timeout: float = 120) -> list[tuple[dict[str, str], bytes]]:
        deadline = time.monotonic() + timeout
        while len(self.calls) < count:
            assert time.monotonic() < deadline, f"{len(self.calls)} webhook(s) after {timeout}s"
            time.sleep(0.2)
        return list(self.calls)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    calls: list[tuple[dict[str, str], bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            calls.append((dict(self.headers), body))
            self.send_response(500 if len(calls) == 1 else 204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Receiver(f"http://127.0.0.1:{server.server_port}/hook", calls)
    server.shutdown()


@dataclass
class Fleet:
    env: dict[str, str]
    base: str
    keys: dict[str, str]
    workers: Workers
    api_log: Path

    def http(self, tenant: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.base, headers={"Authorization": f"Bearer {self.keys[tenant]}"}, timeout=60
        )


def start_fleet(env: dict[str, str], tmp_path: Path, devices: str) -> Iterator[Fleet]:
    env = {
        **env,
        "OCRFLEET_WEBHOOK_SECRET": SECRET,
        "OCRFLEET_WEBHOOK_ALLOW_PRIVATE": "true",  # the receiver is on loopback
        "OCRFLEET_WEBHOOK_BACKOFF_S": "0.5",
        "OCRFLEET_API_MAX_UPLOAD_BYTES": str(UPLOAD_LIMIT),
    }
    keys = {tenant: ocrfleet_cli(env, "keys", "add", tenant).strip() for tenant in "AB"}
    workers = start_workers(env, tmp_path / "workers.log", queues="gpu,ingest", devices=devices)
    api_log = tmp_path / "api.log"
    try:
        with api_process(env, api_log) as base:
            yield Fleet(env, base, keys, workers, api_log)
    finally:
        workers.stop()


@pytest.fixture
def fleet(env: dict[str, str], tmp_path: Path) -> Iterator[Fleet]:
    yield from start_fleet(env, tmp_path, devices="cpu:1")


def wait_status(http: httpx.Client, doc_id: int, wanted: set[str], timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        state = http.get(f"/v1/documents/{doc_id}").json()
        if state["status"] in wanted:
            return state
        assert time.monotonic() < deadline, state
        time.sleep(0.3)


def test_upload_webhook_every_format_tenants_and_limits(fleet: Fleet, receiver: Receiver) -> None:
    a, b = fleet.http("A"), fleet.http("B")
    assert httpx.get(f"{fleet.base}/healthz").status_code == 200
    assert httpx.get(f"{fleet.base}/readyz").json() == {"database": "ok", "broker": "ok"}
    assert "openapi" in httpx.get(f"{fleet.base}/openapi.json").text

    pdf = make_document(7, 2)
    created = a.post(
        "/v1/documents",
        files={"file": ("scan.pdf", pdf, "application/pdf")},
        data={
            "priority": "high",
            "metadata": json.dumps({"batch": "b-17", "tenant": "B"}),
            "callback_url": receiver.url,
        },
    )
    assert created.status_code == 202, created.text
    doc_id = created.json()["id"]
    assert created.json()["metadata"] == {"batch": "b-17", "tenant": "A", "filename": "scan.pdf"}

    # The webhook: refused once (500), delivered on the retry, signed with key A's own
    # secret (not the fleet's, not B's), then never again.
    (_, first), (headers, body) = receiver.wait(2)
    assert json.loads(first)["attempt"] == 1 and json.loads(body)["attempt"] == 2
    assert json.loads(first)["delivery"] == json.loads(body)["delivery"]  # receivers dedupe
    url = fleet.env["OCRFLEET_DATABASE_URL"]
    key_ids = dict(rows(url, "SELECT tenant, id FROM api_keys"))
    secrets = {
        tenant: ocrfleet_cli(fleet.env, "keys", "webhook-secret", str(key_id)).strip()
        for tenant, key_id in key_ids.items()
    }
    signature = headers[webhooks.SIGNATURE_HEADER]
    assert webhooks.key_id_of(signature) == str(key_ids["A"])
    assert webhooks.verify(secrets["A"], signature, body)
    for other in (secrets["B"], SECRET, "another secret"):
        assert not webhooks.verify(other, signature, body)
    assert not webhooks.verify(secrets["A"], signature, body, now=time.time() + 3600)
    event = json.loads(body)
    assert (event["id"], event["status"], event["pages"]) == (
        doc_id,
        "done",
        {"total": 2, "done": 2, "failed": 0},
    )
    assert set(event["results"]) == set(webhooks.RESULT_FORMATS)
    deadline = time.monotonic() + 60  # the worker records the attempt after the response
    while scalar(url, "SELECT callback_state FROM documents") != "delivered":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert rows(url, "SELECT attempt, status_code FROM deliveries ORDER BY attempt") == [
        (1, 500),
        (2, 204),
    ]
    assert not webhooks.notify_finished(settings_from(fleet.env), doc_id)  # claimed once

    state = a.get(f"/v1/documents/{doc_id}").json()
    assert state["status"] == "done"
    assert [p["status"] for p in state["page_states"]] == ["done", "done"]

    # Every format, from the URLs the webhook gave.
    bodies = {}
    for fmt, link in event["results"].items():
        response = a.get(link)
        assert response.status_code == 200, (fmt, response.text)
        bodies[fmt] = response
    token = page_lines(7, 2)[1].split()[1]
    assert token in bodies["text"].text
    assert json.loads(bodies["json"].text)["pages"][1]["regions"]
    assert token in bodies["markdown"].text
    assert bodies["hocr"].text.count('class="ocrx_word"') == len(bodies["text"].text.split())
    alto = etree.fromstring(bodies["alto"].content)
    assert [s.get("CONTENT") for s in alto.iter("{*}String")] == bodies["text"].text.split()
    assert bodies["pdf"].content.startswith(b"%PDF") and bodies["pdf"].headers[
        "content-type"
    ].startswith("application/pdf")

    # The client renders from the same rows as the API.
    assert client.result(doc_id, "hocr", settings=settings_from(fleet.env)) == (
        bodies["hocr"].content
    )

    # A document already in S3, by URI.
    store = open_store(settings_from(fleet.env))
    uri = store.put("intake/A/by-uri.pdf", make_document(11, 1))  # A's intake prefix
    by_uri = a.post("/v1/documents", data={"uri": uri, "metadata": '{"source": "s3"}'})
    assert by_uri.status_code == 202, by_uri.text
    state = wait_status(a, by_uri.json()["id"], {"done", "failed", "rejected"})
    assert state["status"] == "done", state
    assert page_lines(11, 1)[1].split()[1] in a.get(
        f"/v1/documents/{state['id']}/result", params={"format": "text"}
    ).text
    assert a.post("/v1/documents", data={"uri": "file:///etc/passwd"}).status_code == 422

    # Bad input ends rejected with its reason, and has no result to give.
    junk = a.post("/v1/documents", files={"file": ("notes.pdf", b"plain text\n" * 20)})
    rejected = wait_status(a, junk.json()["id"], {"rejected", "failed", "done"})
    assert rejected["status"] == "rejected" and rejected["reason"], rejected
    no_result = a.get(f"/v1/documents/{rejected['id']}/result", params={"format": "alto"})
    assert no_result.status_code == 409 and "no pages" in no_result.text

    # Tenant B sees nothing of A's; no key, no access.
    for response in (
        b.get(f"/v1/documents/{doc_id}"),
        b.get(f"/v1/documents/{doc_id}/result?format=text"),
        b.delete(f"/v1/documents/{doc_id}"),
    ):
        assert response.status_code == 404, response.text
    assert b.get("/v1/documents").json() == {"documents": [], "next": None}
    listed = a.get("/v1/documents", params={"status": "done", "limit": 1}).json()
    assert [d["id"] for d in listed["documents"]] == [doc_id]
    after = a.get("/v1/documents", params={"status": "done", "after": listed["next"]}).json()
    assert [d["id"] for d in after["documents"]] == [state["id"]] and after["next"] is None
    since = a.get("/v1/documents", params={"since": "2999-01-01T00:00:00Z"}).json()
    assert since["documents"] == []
    assert httpx.get(f"{fleet.base}/v1/documents/{doc_id}").status_code == 401
    assert a.delete(f"/v1/documents/{doc_id}").status_code == 409  # finished already

    # Over the upload limit: 413, and nothing new in the store or the database.
    before = store.list("intake/")
    big = make_document(8, 1) + b"\0" * UPLOAD_LIMIT
    refused = a.post("/v1/documents", files={"file": ("big.pdf", big, "application/pdf")})
    assert refused.status_code == 413, refused.text
    assert store.list("intake/") == before
    assert scalar(url, "SELECT count(*) FROM documents") == 3
    # A private callback URL is refused when not allowed (the API allows loopback here).
    refused = a.post(
        "/v1/documents",
        files={"file": ("x.pdf", make_document(9, 1), "application/pdf")},
        data={"callback_url": "ftp://example.org/x"},
    )
    assert refused.status_code == 422 and "http(s)" in refused.text
    metrics = httpx.get(f"{fleet.base}/metrics").text
    assert 'ocrfleet_api_requests_total{method="POST",route="/v1/documents",status="202"}' in (
        metrics
    )


def test_two_tenants_uploading_one_file_get_a_document_each(fleet: Fleet) -> None:
    """The same bytes from A and from B are two documents, each processed, each seen only
    by its tenant; A uploading them again is A's first document."""
    a, b = fleet.http("A"), fleet.http("B")
    upload = {"file": ("same.pdf", make_document(13, 1), "application/pdf")}
    created = [http.post("/v1/documents", files=upload) for http in (a, b, a)]
    assert [r.status_code for r in created] == [202, 202, 202], [r.text for r in created]
    a_id, b_id, a_again = (r.json()["id"] for r in created)
    assert a_id != b_id and a_again == a_id
    assert [r.json()["metadata"]["tenant"] for r in created] == ["A", "B", "A"]

    token = page_lines(13, 1)[1].split()[1]
    for http, doc_id, other in ((a, a_id, b_id), (b, b_id, a_id)):
        assert wait_status(http, doc_id, {"done", "failed", "rejected"})["status"] == "done"
        text = http.get(f"/v1/documents/{doc_id}/result", params={"format": "text"}).text
        assert token in text
        assert [d["id"] for d in http.get("/v1/documents").json()["documents"]] == [doc_id]
        assert http.get(f"/v1/documents/{other}").status_code == 404
    url = fleet.env["OCRFLEET_DATABASE_URL"]
    assert rows(url, "SELECT id, tenant, pages_done FROM documents ORDER BY id") == [
        (a_id, "A", 1),
        (b_id, "B", 1),
    ]


def test_cancel_mid_document(fleet: Fleet, receiver: Receiver) -> None:
    a = fleet.http("A")
    pages = 8
    created = a.post(
        "/v1/documents",
        files={"file": ("long.pdf", make_document(30, pages), "application/pdf")},
        data={"callback_url": receiver.url},
    )
    doc_id = created.json()["id"]
    url = fleet.env["OCRFLEET_DATABASE_URL"]
    deadline = time.monotonic() + 300
    while scalar(url, "SELECT pages_done FROM documents WHERE id = :d", d=doc_id) < 1:
        assert time.monotonic() < deadline, fleet.workers.log_tail()
        time.sleep(0.1)
    cancelled = a.delete(f"/v1/documents/{doc_id}")
    assert cancelled.json() == {"id": doc_id, "status": "cancelled"}, cancelled.text
    started_at_cancel = {
        n for (n,) in rows(url, "SELECT number FROM pages WHERE deliveries > 0")
    }
    # The cancel closed every page left, in its own transaction: no backlog from now on.
    assert scalar(url, "SELECT count(*) FROM pages WHERE status = 'pending'") == 0
    assert database_signals(url, time.time())["pending_pages"] == {"high": 0, "normal": 0}

    # Wait for the fleet to go idle: every queued page message consumed.
    deadline = time.monotonic() + 120
    while any(queue_depths(fleet.env["OCRFLEET_BROKER_URL"]).values()):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    time.sleep(1.0)

    state = a.get(f"/v1/documents/{doc_id}").json()
    assert state["status"] == "cancelled"
    started = {n for (n,) in rows(url, "SELECT number FROM pages WHERE deliveries > 0")}
    # At most the page a worker had already checked when the cancel landed starts later.
    assert len(started - started_at_cancel) <= 1, (started, started_at_cancel)
    # Pages running when the cancel landed finished and count; the others stay cancelled.
    skipped = {p["number"] for p in state["page_states"] if p["status"] == "cancelled"}
    done = {p["number"] for p in state["page_states"] if p["status"] == "done"}
    assert skipped | done == set(range(1, pages + 1)), state
    assert len(done) == state["pages"]["done"] >= 1
    assert len(skipped) >= pages - len(started_at_cancel) - 1 >= 1
    assert len(skipped & started) <= 1  # the page checked just before the cancel, if any
    assert "skipped: its document was cancelled" in fleet.workers.log_tail(200_000)
    # One webhook (after the 500 on the first attempt), for the cancellation.
    calls = receiver.wait(2)
    assert [json.loads(body)["status"] for _, body in calls] == ["cancelled", "cancelled"]
    time.sleep(1.0)
    assert len(receiver.calls) == 2
    assert json.loads(ocrfleet_cli(fleet.env, "status", "--stuck", "--age", "0", "--json")) == []
