"""Finding 11 (API part) against a real `ocrfleet api` process on PostgreSQL, Redis and
moto's S3: the odd inputs that were 500s (and dropped the connection) are 4xx with a
one-line reason, and a Schemathesis fuzz of every route of the OpenAPI schema, valid and
invalid requests, with tenant acme's key and with another, a bogus or no key, and a
Hypothesis fuzz of every path (the probes, /metrics and /docs too) with any method, odd
path parts and queries, get no response >= 500.

OCRFLEET_FUZZ_EXAMPLES (default 150) sets the examples of each fuzz: 3 requests per
example in all, so `OCRFLEET_FUZZ_EXAMPLES=700` makes the 2,000-plus of the report
(`-s` prints the count)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from ocrfleet.api.app import create_app
from ocrfleet.config import Settings
from tests.conftest import RedisServer
from tests.security.api_server import ApiServer, running_api
from tests.security.test_outputs import RUN_ID, store_document

UPLOAD_LIMIT = 200_000
EXAMPLES = int(os.environ.get("OCRFLEET_FUZZ_EXAMPLES", "150"))
# Both fuzzes: EXAMPLES each, the same examples on every run, nothing kept between runs.
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
BIG = str(2**64)
# The schema the server serves, built from the same app (the server is not up at import).
SCHEMA = schemathesis.openapi.from_dict(
    create_app(Settings(_env_file=None)).openapi()  # type: ignore[call-arg]
)
CASES = st.one_of(
    SCHEMA.as_strategy(GenerationMode.POSITIVE), SCHEMA.as_strategy(GenerationMode.NEGATIVE)
)
TALLY: Counter[int] = Counter()


@pytest.fixture(scope="module")
def api(
    moto_endpoint: str, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiServer]:
    with running_api(
        moto_endpoint,
        redis_server.database(),
        tmp_path_factory.mktemp("fuzz"),
        OCRFLEET_API_MAX_UPLOAD_BYTES=str(UPLOAD_LIMIT),
        OCRFLEET_API_RATE_PER_S="100000",  # the fuzz is one client: no 429s in its way
        OCRFLEET_API_RATE_BURST="100000",
        OCRFLEET_RUN_ID=RUN_ID,  # registered by store_document: submissions need no models
    ) as server:
        with pytest.MonkeyPatch.context() as patch:  # moto's credentials, for our store
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
                patch.setenv(name, server.env[name])
            store_document(server)  # a finished document of acme's, id 1: results to fetch
        yield server


def one_line_reason(reply: httpx.Response) -> str:
    """The 4xx's `detail`, checked to be one line of text."""
    assert 400 <= reply.status_code < 500, (reply.status_code, reply.text[:500])
    detail = reply.json()["detail"]
    assert isinstance(detail, str) and detail and "\n" not in detail, detail
    return detail


@pytest.mark.finding(
    11,
    before="document=², ids over 2^63, NUL in a filter, metadata 100k deep: 500, dropped",
    after="422 with a one-line reason naming the field; the connection stays up",
)
def test_odd_input_is_a_4xx_with_a_reason(api: ApiServer) -> None:
    deep = "[" * 60_000 + "]" * 60_000
    with api.http("acme") as client:  # one connection: each answer must keep it usable
        checks = [
            (client.get("/v1/documents/²"), "document_id"),
            (client.get(f"/v1/documents/{BIG}"), "less than or equal to"),
            (client.get(f"/v1/documents/{2**63}/result"), "less than or equal to"),
            (client.delete(f"/v1/documents/{BIG}"), "less than or equal to"),
            (client.get("/v1/documents", params={"after": BIG}), "after"),
            (client.get("/v1/documents", params={"status": "done\x00"}), "status"),
            (client.get("/v1/documents", params={"since": "2026-13-01"}), "since"),
            (client.get("/v1/documents/1/result", params={"format": "x\x00"}), "format"),
        ]
        upload = {"file": ("scan.png", b"\x89PNG", "image/png")}
        for fields, reason in [
            ({"metadata": "[" * 100_000}, "over 65536 bytes"),
            ({"metadata": f'{{"a": {deep[:60_000]}}}'}, "nested over 32 deep"),
            ({"metadata": '{"a": {"b": ' * 40 + "1" + "}}" * 40}, "nested over 32 deep"),
            ({"metadata": '{"a": "\\u0000"}'}, "NUL"),
            ({"metadata": '{"a\\u0000": 1}'}, "NUL"),
            ({"metadata": '{"a": "\\ud800"}'}, "lone surrogate"),
            ({"metadata": '{"a": NaN}'}, "NaN"),
            ({"metadata": '{"a": ' + "9" * 5000 + "}"}, "number too long"),
            ({"metadata": "[1]"}, "JSON object"),
            ({"callback_url": "https://x.example/\x00"}, "NUL"),
            ({"priority": "high\x00"}, "NUL"),
        ]:
            checks.append((client.post("/v1/documents", files=upload, data=fields), reason))
        checks.append(
            (client.post("/v1/documents", data={"uri": "s3://b/k\x00"}), "NUL"),
        )
        for reply, reason in checks:
            detail = one_line_reason(reply)
            assert reply.status_code == 422, (reply.status_code, detail)
            assert reason in detail, (reason, detail)
        assert client.get("/v1/documents/1").status_code == 200  # still connected, still serving


@pytest.mark.finding(
    11,
    before="a chunked body over the upload limit got 400 (the form parser's error)",
    after="413 naming the limit, nothing stored",
)
def test_a_chunked_body_over_the_limit_is_413(api: ApiServer) -> None:
    boundary = "fuzzboundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.png"\r\n'
        "Content-Type: image/png\r\n\r\n"
    ).encode()

    def chunks() -> Iterator[bytes]:  # no Content-Length: Transfer-Encoding: chunked
        yield head
        for _ in range(UPLOAD_LIMIT // 10_000 + 5):
            yield b"\x00" * 10_000

    with api.http("acme") as client:
        before = client.get("/v1/documents").json()["documents"]
        reply = client.post(
            "/v1/documents",
            content=chunks(),
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        assert reply.status_code == 413, reply.text
        assert str(UPLOAD_LIMIT) in one_line_reason(reply)
    with api.http("acme") as client:
        assert client.get("/v1/documents").json()["documents"] == before


@pytest.mark.finding(
    11,
    before="(no fuzz) odd requests found by hand gave 500s",
    after="Schemathesis over every route, valid and invalid, with and without a key: no 5xx",
)
@FUZZ
@given(case=CASES, other=st.sampled_from(["globex", "bogus", None]))
def test_fuzz_every_route_gets_no_5xx(
    api: ApiServer, case: schemathesis.Case, other: str | None
) -> None:
    for who in ("acme", other):
        key = api.keys.get(who or "", "ocr_bogus-key") if who else None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        reply = case.call(base_url=api.base, headers=headers, timeout=60)
        TALLY[reply.status_code] += 1
        assert reply.status_code < 500, (case.method, case.path, reply.status_code, reply.text)
        if reply.status_code >= 400:
            detail = json.loads(reply.text)["detail"]
            assert isinstance(detail, str) and "\n" not in detail, detail


# The routes outside the schema too: probes, metrics, docs and their assets.
ROUTES = (
    "/healthz",
    "/readyz",
    "/metrics",
    "/docs",
    "/redoc",
    "/docs/oauth2-redirect",
    "/openapi.json",
    "/v1/documents",
    "/v1/documents/{}",
    "/v1/documents/{}/result",
    "/static-offline-docs/{}",
    "/{}",
)
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


@pytest.mark.finding(
    11,
    before="(no fuzz) routes outside the schema were never probed",
    after="Hypothesis over every route, any method, odd path parts and queries: no 5xx",
)
@FUZZ
@given(
    route=st.sampled_from(ROUTES),
    part=st.text(max_size=40),
    method=st.sampled_from(METHODS),
    query=st.dictionaries(st.text(max_size=12), st.text(max_size=40), max_size=4),
    keyed=st.booleans(),
)
def test_fuzz_every_path_method_and_query_gets_no_5xx(
    api: ApiServer, route: str, part: str, method: str, query: dict[str, str], keyed: bool
) -> None:
    path = route.format(quote(part, safe=""))
    with api.http("acme" if keyed else None) as client:
        reply = client.request(method, path, params=query)
    TALLY[reply.status_code] += 1
    assert reply.status_code < 500, (method, path, query, reply.status_code, reply.text[:500])


def test_fuzz_tally(api: ApiServer) -> None:
    """The fuzz's count for the report (run with -s to see it): every request answered."""
    total = sum(TALLY.values())
    statuses = dict(sorted(TALLY.items()))
    print(f"\napi fuzz: {total} requests, {EXAMPLES} examples, statuses {statuses}")
    assert total >= 2 * EXAMPLES  # the first request of each schema example, each raw one
    assert not [status for status in TALLY if status >= 500]
