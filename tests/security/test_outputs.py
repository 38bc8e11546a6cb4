"""Findings 9 and 12 (API part) against a real `ocrfleet api` process on PostgreSQL, Redis
and moto's S3: a document whose OCR text is markup (script tags, event handlers,
`javascript:` links, an HTML table region carrying a script) is fetched in every format;
the Markdown is rendered with python-markdown and markdown-it (HTML on) as a reader would,
and nothing executable survives in any of them while every character read is still there.
No output or unauthenticated endpoint shows the fleet's store URIs, `/readyz` names only
the dependency that is down, and /docs loads nothing from outside."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import markdown as python_markdown
import pytest
from lxml import etree, html
from markdown_it import MarkdownIt
from PIL import Image

from ocrfleet import ir, webhooks
from ocrfleet.db.models import Document, Page, Run
from ocrfleet.db.persist import save_page_result
from ocrfleet.db.session import session_scope
from ocrfleet.storage import open_store
from tests.conftest import RedisServer, free_port
from tests.integration.fleet_helpers import settings_from
from tests.security.api_server import ApiServer, running_api
from tests.unit.test_formats import alto_schema

# What OCR read (or a reviewer typed): markup of every kind a Markdown reader would run.
TEXT = (
    "<script>alert(1)</script> <img src=x onerror=alert(2)> [click](javascript:alert(3)) "
    "![i](javascript:alert(4)) <javascript:alert(5)> &lt;script&gt;alert(6)&lt;/script&gt; "
    "\\[a\\](javascript:alert(7)) [r]: javascript:alert(8)"
)
TITLE = "<svg onload=alert(9)>Report</svg>"
HTML_TABLE = (
    '<table><tr><td onclick="alert(10)"><img src=x onerror=alert(11)>cell</td></tr>\n\n'
    "<tr><td>[x](javascript:alert(12))</td></tr></table><script>alert(13)</script>"
)
PLAIN_TABLE = "a  <b onmouseover=alert(14)>x</b>\n[c](javascript:alert(15))  `d`"
FORMULA = "x < y <script>alert(16)</script> [a](javascript:alert(17)) \\sqrt[3]{x}"
FILENAME = "<script>alert(18)</script>.pdf"
RUN_ID = "e" * 64  # the document's run, registered here (pinned by the API fuzz)
RENDERERS = {
    "python-markdown": lambda text: python_markdown.markdown(text),
    "python-markdown+tables": lambda text: python_markdown.markdown(text, extensions=["tables"]),
    "markdown-it commonmark": MarkdownIt("commonmark").render,  # html: true
    "markdown-it default+tables": MarkdownIt("default", {"html": True}).render,
}


def dangers(rendered: str) -> list[str]:
    """What a browser would run or follow in `rendered` HTML: script-like elements, event
    handler attributes, and links or sources with a script scheme."""
    root = html.fragment_fromstring(rendered, create_parent="div")
    found = []
    for element in root.iter():
        if not isinstance(element.tag, str):
            continue
        if element.tag in {"script", "img", "svg", "iframe", "object", "embed", "a"}:
            found.append(f"<{element.tag}>")
        for name, value in element.attrib.items():
            if name.lower().startswith("on"):
                found.append(f"{element.tag}[{name}]")
            if re.match(r"\s*(javascript|data|vbscript):", value, re.I):
                found.append(f"{element.tag}[{name}={value}]")
    return found


def region_texts() -> list[tuple[ir.Category, str]]:
    return [
        (ir.Category.title, TITLE),
        (ir.Category.text, TEXT),
        (ir.Category.table, HTML_TABLE),
        (ir.Category.table, PLAIN_TABLE),
        (ir.Category.formula, FORMULA),
    ]


def store_document(api: ApiServer) -> int:
    """A partial document of acme's with the regions above on page 1 and a page 2 that
    failed on a missing image, its reason naming the image's store URI."""
    settings = settings_from(api.env)
    store = open_store(settings)
    image = io.BytesIO()
    Image.new("RGB", (200, 200), "white").save(image, format="PNG")
    keys = [f"pages/{'c' * 64}/{n}.png" for n in (1, 2)]
    for key in keys:
        store.put(key, image.getvalue())
    box = ir.BBox(x0=10, y0=10, x1=190, y1=30)
    regions = region_texts()
    result = ir.PageResult(
        page_number=1,
        regions=[
            ir.Region(number=n, category=category, bbox=box)
            for n, (category, _) in enumerate(regions, start=1)
        ],
        candidates=[
            ir.Candidate(region_number=n, engine="rapidocr", text=text)
            for n, (_, text) in enumerate(regions, start=1)
        ],
    )
    with session_scope(settings.database_url) as session:
        session.add(Run(id=RUN_ID, config={"dpi": 72}))
        session.flush()
        doc = Document(
            run_id=RUN_ID,
            sha256="c" * 64,
            tenant="acme",
            source_uri=store.uri(f"uploads/{'c' * 64}"),
            status="partial",
            page_count=2,
            pages_done=1,
            pages_failed=1,
            reason=f"page 2: ObjectNotFound: get {store.uri(keys[1])}: NoSuchKey",
            meta={"tenant": "acme", "filename": FILENAME},
        )
        session.add(doc)
        session.flush()
        pages = [
            Page(
                document_id=doc.id,
                number=n,
                width=200,
                height=200,
                image_uri=store.uri(key),
                status="done" if n == 1 else "failed",
                reason=None if n == 1 else f"ObjectNotFound: get {store.uri(key)}: NoSuchKey",
            )
            for n, key in enumerate(keys, start=1)
        ]
        session.add_all(pages)
        session.flush()
        save_page_result(session, pages[0].id, result)
        return doc.id


@pytest.fixture(scope="module")
def served(
    moto_endpoint: str, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ApiServer, int]]:
    with running_api(
        moto_endpoint, redis_server.database(), tmp_path_factory.mktemp("outputs")
    ) as api:
        with pytest.MonkeyPatch.context() as patch:  # moto's credentials, for our store
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
                patch.setenv(name, api.env[name])
            document_id = store_document(api)
        yield api, document_id


def fetch(api: ApiServer, document_id: int, fmt: str) -> httpx.Response:
    with api.http("acme") as client:
        reply = client.get(f"/v1/documents/{document_id}/result", params={"format": fmt})
    assert reply.status_code == 200, (fmt, reply.text)
    assert reply.headers["x-content-type-options"] == "nosniff"
    return reply


@pytest.mark.finding(
    9,
    before="OCR text <script>/<img onerror>/[x](javascript:) ran when the Markdown was rendered",
    after="python-markdown and markdown-it (HTML on) render it as text: no tag, handler or link",
)
@pytest.mark.parametrize("renderer", sorted(RENDERERS))
def test_markdown_renders_ocr_markup_as_text(served: tuple[ApiServer, int], renderer: str) -> None:
    api, document_id = served
    render = RENDERERS[renderer]
    # The check itself sees the attack in the text as it was read.
    for _, text in region_texts():
        assert dangers(render(text)), (renderer, text)

    rendered = render(fetch(api, document_id, "markdown").text)
    assert dangers(rendered) == [], rendered
    shown = html.fragment_fromstring(rendered, create_parent="div").text_content()
    # Every character read is shown as read (HTML tables keep cell text, not tags).
    for text in (TEXT, TITLE, FORMULA):
        assert " ".join(text.split()) in " ".join(shown.split()), (renderer, text, shown)
    for piece in ("cell", "[x](javascript:alert(12))", "alert(13)", "[c](javascript:alert(15))"):
        assert piece in shown, (renderer, piece)
    assert "<table><tr><td>cell</td></tr>" in rendered  # the table is still a table


@pytest.mark.finding(
    9,
    before="hOCR, ALTO, JSON, text: markup passed through as data, unchecked",
    after="hOCR and ALTO parse as XML with the text as text; JSON and text give it back exact",
)
def test_every_other_format_keeps_markup_as_data(served: tuple[ApiServer, int]) -> None:
    api, document_id = served
    words = " ".join(" ".join(text.split()) for _, text in region_texts())

    hocr = fetch(api, document_id, "hocr")
    root = etree.fromstring(hocr.content)
    names = {etree.QName(el).localname for el in root.iter() if isinstance(el.tag, str)}
    assert names <= {"html", "head", "title", "meta", "body", "div", "span"}, names
    assert not [a for el in root.iter() for a in el.attrib if a.lower().startswith("on")]
    title = root.find("{*}head/{*}title").text
    assert title == FILENAME
    hocr_words = [el.text for el in root.iter() if el.get("class") == "ocrx_word"]
    assert " ".join(hocr_words) == words

    alto = etree.fromstring(fetch(api, document_id, "alto").content)
    alto_schema().assertValid(alto)
    assert " ".join(el.get("CONTENT") for el in alto.iter("{*}String")) == words
    assert alto.find(".//{*}fileName").text == FILENAME

    body = fetch(api, document_id, "json").json()
    assert [r["text"] for r in body["pages"][0]["regions"]] == [t for _, t in region_texts()]
    text = fetch(api, document_id, "text")
    assert text.headers["content-type"].startswith("text/plain")
    assert text.text.split("\f")[0].strip() == "\n".join(t for _, t in region_texts())


@pytest.mark.finding(
    12,
    before="hOCR titles showed s3://bucket/... page images; JSON and ALTO the source URI",
    after="no output, status, listing or webhook names the bucket, a store URI or a key",
)
def test_no_output_names_the_store(served: tuple[ApiServer, int]) -> None:
    api, document_id = served
    leaks = re.compile(rf"s3://|file://|{api.bucket}|pages/c{{64}}|uploads/c{{64}}")
    for fmt in ("text", "json", "markdown", "hocr", "alto", "pdf"):
        body = fetch(api, document_id, fmt).content.decode("latin-1")
        assert not leaks.search(body), (fmt, leaks.search(body))
    with api.http("acme") as client:
        status = client.get(f"/v1/documents/{document_id}").text
        listing = client.get("/v1/documents").text
    assert not leaks.search(status) and not leaks.search(listing), (status, listing)
    assert "ObjectNotFound: get <store object>: NoSuchKey" in status  # the reason, no URI
    with session_scope(api.database_url) as session:  # the webhook tells the same reason
        doc = session.get(Document, document_id)
        reason = webhooks.payload(settings_from(api.env), doc, attempt=1)["reason"]
    assert reason == "page 2: ObjectNotFound: get <store object>: NoSuchKey"
    alto = fetch(api, document_id, "alto").text
    assert "<store object>" not in alto  # a reason is not a name


@pytest.mark.finding(
    12,
    before="Swagger UI at /docs loaded its script and CSS from a CDN",
    after="/docs and /redoc load only the API's own /static-offline-docs assets",
)
def test_docs_load_nothing_from_outside(served: tuple[ApiServer, int]) -> None:
    api, _ = served
    with httpx.Client(base_url=api.base, timeout=30) as client:
        assert client.get("/openapi.json").json()["paths"]
        for page in ("/docs", "/redoc"):
            reply = client.get(page)
            assert reply.status_code == 200, page
            linked = re.findall(r"""(?:src|href)=["']([^"']+)""", reply.text)
            linked += re.findall(r"""url:\s*["']([^"']+)""", reply.text)
            assert linked, reply.text
            assert not [u for u in linked if re.match(r"(https?:)?//", u)], (page, linked)
            for url in linked:
                if url.endswith((".js", ".css")):
                    asset = client.get(url)
                    assert asset.status_code == 200 and len(asset.content) > 10_000, url


@pytest.mark.finding(
    12,
    before="/readyz (no auth) showed the database and broker errors with host:port",
    after="/readyz says which is down and nothing else; the error goes to the API's log",
)
def test_readyz_names_the_dependency_not_its_address(
    served: tuple[ApiServer, int], moto_endpoint: str, tmp_path: Path
) -> None:
    api, _ = served
    assert httpx.get(f"{api.base}/readyz").json() == {"database": "ok", "broker": "ok"}
    closed = free_port()  # nothing listens here
    with running_api(
        moto_endpoint,
        f"redis://127.0.0.1:{closed}/0",
        tmp_path,
        OCRFLEET_DATABASE_URL=f"postgresql+psycopg://ocr:pw@127.0.0.1:{closed}/secret_db",
    ) as down:
        reply = httpx.get(f"{down.base}/readyz", timeout=60)
    assert (reply.status_code, reply.json()) == (503, {"database": "down", "broker": "down"})
    log = (tmp_path / "cache" / "ocrfleet.log").read_text()  # the operator's, with the why
    assert "readyz: the database is down" in log and "readyz: the broker is down" in log
    assert str(closed) in log
