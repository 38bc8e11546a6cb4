"""Finding 1 of issue 18: `uri=` read any S3 bucket with the fleet's credentials. Against
the real API server (`ocrfleet api`), PostgreSQL, Redis and moto's S3 server: a tenant
names only objects under its own intake prefix or an allow-listed source; another bucket,
another tenant's objects, a missing object and every traversal or local-file trick get one
and the same answer; the fleet reads no bucket the operator did not list."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx
import pytest
from pydantic import ValidationError

from ocrfleet import client
from ocrfleet.api.app import NO_SOURCE
from ocrfleet.config import Settings
from ocrfleet.gc import collect_garbage
from ocrfleet.storage import SourceRefused, read_uri
from ocrfleet.tasks.sweeps import ingest_intake
from tests.integration.conftest import env  # noqa: F401 - the fleet's fixture
from tests.integration.fleet_helpers import (
    api_process,
    make_document,
    ocrfleet_cli,
    rows,
    scalar,
    settings_from,
)

pytestmark = pytest.mark.integration


@dataclass
class Api:
    env: dict[str, str]
    base: str
    keys: dict[str, str]
    s3: object
    bucket: str  # the store's
    private: str  # a bucket the operator did not list
    uploads: str  # listed as s3://<uploads>/{tenant}/in
    shared: str  # listed as s3://<shared>/pub

    def post(self, tenant: str, uri: str) -> httpx.Response:
        return httpx.post(
            f"{self.base}/v1/documents",
            data={"uri": uri},
            headers={"Authorization": f"Bearer {self.keys[tenant]}"},
            timeout=60,
        )

    def put(self, bucket: str, key: str, data: bytes) -> str:
        self.s3.put_object(Bucket=bucket, Key=key, Body=data)  # type: ignore[attr-defined]
        return f"s3://{bucket}/{key}"


@pytest.fixture
def api(env: dict[str, str], tmp_path: Path) -> Iterator[Api]:  # noqa: F811
    s3 = boto3.client("s3", endpoint_url=env["OCRFLEET_S3_ENDPOINT_URL"], region_name="us-east-1")
    names = {}
    for role in ("private", "uploads", "shared"):
        names[role] = f"{role}-{uuid.uuid4().hex[:10]}"
        s3.create_bucket(Bucket=names[role])
    env = {
        **env,
        "OCRFLEET_SOURCE_ALLOW": f"s3://{names['uploads']}/{{tenant}}/in,"
        f"s3://{names['shared']}/pub",
    }
    keys = {tenant: ocrfleet_cli(env, "keys", "add", tenant).strip() for tenant in "AB"}
    with api_process(env, tmp_path / "api.log") as base:
        bucket = env["OCRFLEET_STORE_URL"].removeprefix("s3://").split("/")[0]
        yield Api(env, base, keys, s3, bucket, **names)


@pytest.mark.finding(
    1,
    before="uri=s3://ops-private/hr/payroll.png: 202 and the payroll text; existing 202, "
    "missing 500 (a bucket probe)",
    after="422, one text for another bucket, another tenant's object, a missing one and "
    "every traversal; no request to an unlisted bucket",
)
def test_a_tenant_names_only_its_own_sources(api: Api) -> None:
    payroll = make_document(5, 1)
    secret = api.put(api.private, "hr/payroll.pdf", payroll)
    b_own = api.put(api.bucket, "fleet/intake/B/scan.pdf", make_document(6, 1))
    b_data = make_document(7, 1)  # PDFs carry their creation time: keep the bytes
    b_upload = api.put(api.uploads, "B/in/scan.pdf", b_data)
    fleet_upload = api.put(api.bucket, "fleet/intake/" + "0" * 64, make_document(8, 1))
    intake_a = f"s3://{api.bucket}/fleet/intake/A"

    refused = {
        "another bucket, existing object": secret,
        "another bucket, missing object": f"s3://{api.private}/hr/none.pdf",
        "a bucket that does not exist": f"s3://nobucket-{uuid.uuid4().hex[:8]}/x.pdf",
        "missing object in A's intake": f"{intake_a}/none.pdf",
        "B's intake object": b_own,
        "B's allow-listed object": b_upload,
        "an upload of the fleet's": fleet_upload,
        "the store outside intake": f"s3://{api.bucket}/fleet/derived/x.png",
        "dot-dot out of A's intake": f"{intake_a}/../B/scan.pdf",
        "empty segment": f"{intake_a}//scan.pdf",
        "A's prefix itself": f"{intake_a}/",
        "encoded dot-dot": f"{intake_a}/%2e%2e/B/scan.pdf",
        "backslash": f"{intake_a}/..\\B\\scan.pdf",
        "control character": f"{intake_a}/scan\x01.pdf",
        "allow-list prefix without the tenant": f"s3://{api.uploads}/A/scan.pdf",
        "allow-list sibling": f"s3://{api.shared}/pubx/scan.pdf",
    }
    answers = {name: api.post("A", uri) for name, uri in refused.items()}
    for name, response in answers.items():
        assert (response.status_code, response.json()) == (422, {"detail": NO_SOURCE}), name
    for uri in ("file:///etc/passwd", "/etc/passwd", "../../etc/passwd", "http://x/a.pdf"):
        response = api.post("A", uri)
        assert response.status_code == 422, (uri, response.text)
        assert "root:" not in response.text
    url = api.env["OCRFLEET_DATABASE_URL"]
    assert scalar(url, "SELECT count(*) FROM documents") == 0

    # What A may name: its intake prefix and the allow-list (its own part, and the shared).
    own, listed, shared = (make_document(n, 1) for n in (9, 10, 11))
    allowed = {
        api.put(api.bucket, "fleet/intake/A/2026/scan.pdf", own): own,
        api.put(api.uploads, "A/in/scan.pdf", listed): listed,
        api.put(api.shared, "pub/form.pdf", shared): shared,
    }
    for uri, data in allowed.items():
        response = api.post("A", uri)
        assert response.status_code == 202, (uri, response.text)
        assert response.json()["sha256"] == hashlib.sha256(data).hexdigest()
        assert response.json()["metadata"]["tenant"] == "A"
    sources = {uri for (uri,) in rows(url, "SELECT source_uri FROM documents")}
    assert sources == set(allowed)

    # Below the API: the fleet's own reads refuse an unlisted bucket before any request (a
    # request would say NoSuchBucket), and read listed places.
    settings = settings_from(api.env)
    with pytest.raises(SourceRefused):
        read_uri(refused["a bucket that does not exist"], settings)
    with pytest.raises(SourceRefused):
        read_uri(secret, settings)
    assert read_uri(b_upload, settings) == b_data


@pytest.mark.finding(
    1,
    before="objects dropped under intake/ were submitted without their tenant",
    after="the intake sweep submits intake/<tenant>/ objects as that tenant's; gc keeps them",
)
def test_the_intake_sweep_and_gc_honour_tenant_prefixes(
    env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    settings = settings_from({**env, "OCRFLEET_INTAKE_PREFIX": "intake/"})
    s3 = boto3.client("s3", endpoint_url=env["OCRFLEET_S3_ENDPOINT_URL"], region_name="us-east-1")
    bucket = env["OCRFLEET_STORE_URL"].removeprefix("s3://").split("/")[0]
    s3.put_object(Bucket=bucket, Key="fleet/intake/A/dropped.pdf", Body=make_document(12, 1))
    # The trusted CLI path: a local file named by the operator is read and uploaded.
    local = tmp_path / "local.pdf"
    local.write_bytes(make_document(13, 1))
    uploaded = client.submit(local, settings=settings)

    (swept,) = ingest_intake(settings)
    state = client.status(swept, settings=settings)
    assert state.meta["tenant"] == "A"
    assert state.source_uri == f"s3://{bucket}/fleet/intake/A/dropped.pdf"
    assert client.status(uploaded, settings=settings).meta == {"filename": "local.pdf"}
    url = env["OCRFLEET_DATABASE_URL"]
    assert rows(url, "SELECT tenant FROM documents WHERE id = :d", d=swept) == [("A",)]
    assert ingest_intake(settings) == []  # once

    s3.put_object(Bucket=bucket, Key="fleet/intake/B/not-yet.pdf", Body=b"%PDF-1.4 later")
    garbage = collect_garbage(settings)
    assert not [key for key in garbage.keys if key.startswith("intake/B/")]


@pytest.mark.finding(
    1,
    before="no setting said which buckets the fleet may read",
    after="OCRFLEET_SOURCE_ALLOW lists them; a malformed entry is a configuration error",
)
def test_a_malformed_source_entry_is_a_configuration_error() -> None:
    for bad in ("http://x/y", "s3://b/{tenant}x", "s3://b/{tenant}/a/{tenant}", "s3://b/../x"):
        with pytest.raises(ValidationError, match="source_allow"):
            Settings(_env_file=None, source_allow=bad)
    settings = Settings(_env_file=None, source_allow=" s3://b/in/{tenant}/ , s3://c ")
    assert settings.source_allow == ["s3://b/in/{tenant}", "s3://c"]
