"""ALTO v4 (valid against alto-4-4.xsd): a `Page` per page with one `PrintSpace`, a
`TextBlock` per region, a `TextLine` per line and a `String` per word, `SP` between words.
A word's `WC` (0-1) is its region's verified score (`RegionView.verified`), not the engine's
own confidence; a region waiting for review refers (`TAGREFS`) to an `OtherTag` whose LABEL
is its flag reason. Measurement unit: pixels of the page image."""

from __future__ import annotations

from lxml import etree

from ocrfleet import ir
from ocrfleet.formats.document import DocumentView

MEDIA_TYPE = "application/xml"
NS = "http://www.loc.gov/standards/alto/ns-v4#"
XSI = "http://www.w3.org/2001/XMLSchema-instance"
SCHEMA_LOCATION = f"{NS} http://www.loc.gov/standards/alto/v4/alto-4-4.xsd"


def _el(parent: etree._Element, tag: str, **attrs: object) -> etree._Element:
    return etree.SubElement(parent, f"{{{NS}}}{tag}", {k: str(v) for k, v in attrs.items()})


def _box(box: ir.BBox) -> dict[str, int]:
    return {"HPOS": box.x0, "VPOS": box.y0, "WIDTH": box.width, "HEIGHT": box.height}


def render(doc: DocumentView) -> str:
    root = etree.Element(
        f"{{{NS}}}alto",
        nsmap={None: NS, "xsi": XSI},
        attrib={f"{{{XSI}}}schemaLocation": SCHEMA_LOCATION},
    )
    description = _el(root, "Description")
    _el(description, "MeasurementUnit").text = "pixel"
    source = _el(description, "sourceImageInformation")
    if filename := doc.filename:  # never the store URI: that is the fleet's, not the tenant's
        _el(source, "fileName").text = filename
    processing = _el(description, "Processing", ID="ocrfleet")
    software = _el(processing, "processingSoftware")
    _el(software, "softwareName").text = "ocrfleet"
    flags = sorted({f for page in doc.pages for r in page.regions if (f := r.awaiting_review)})
    if flags:
        tags = _el(root, "Tags")
        about = "awaiting review: open it with `ocrfleet review`"
        for n, flag in enumerate(flags, start=1):
            _el(tags, "OtherTag", ID=f"flag_{n}", TYPE="review", LABEL=flag, DESCRIPTION=about)
    tag_of = {flag: f"flag_{n}" for n, flag in enumerate(flags, start=1)}
    layout = _el(root, "Layout")
    for page in doc.pages:
        p = page.number
        page_el = _el(
            layout, "Page", ID=f"page_{p}", PHYSICAL_IMG_NR=p, WIDTH=page.width, HEIGHT=page.height
        )
        space = _el(page_el, "PrintSpace", HPOS=0, VPOS=0, WIDTH=page.width, HEIGHT=page.height)
        for region in page.regions:
            r = region.region.number
            block = _el(space, "TextBlock", ID=f"block_{p}_{r}", **_box(region.region.bbox))
            if (flag := region.awaiting_review) is not None:
                block.set("TAGREFS", tag_of[flag])
            verified = region.verified
            for n, line in enumerate(region.lines, start=1):
                line_el = _el(block, "TextLine", ID=f"line_{p}_{r}_{n}", **_box(line.bbox))
                for w, word in enumerate(line.words, start=1):
                    if w > 1:
                        _el(line_el, "SP")
                    attrs: dict[str, object] = {"ID": f"word_{p}_{r}_{n}_{w}", **_box(word.bbox)}
                    attrs["CONTENT"] = word.text
                    if verified is not None:
                        attrs["WC"] = f"{verified:.4f}"
                    _el(line_el, "String", **attrs)
    return etree.tostring(root, xml_declaration=True, encoding="UTF-8", pretty_print=True).decode()
