"""hOCR 1.2: one `ocr_page` per page, an `ocr_carea` per region, an `ocr_line` per line of
its words and an `ocrx_word` per word, each with its `bbox`; words carry `x_wconf` (0-100),
their region's verified score (`RegionView.verified`), not the engine's own confidence, and
a region waiting for review carries its flag reason in `data-flag`. Text and the title are
HTML-escaped; pages carry no `image` property, whose value would be the fleet's own store URI
of the page image."""

from __future__ import annotations

from html import escape

from ocrfleet import ir
from ocrfleet.formats.document import DocumentView

MEDIA_TYPE = "text/html; charset=utf-8"


def _bbox(box: ir.BBox) -> str:
    return f"bbox {box.x0} {box.y0} {box.x1} {box.y1}"


def render(doc: DocumentView) -> str:
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"',
        '    "http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">',
        '<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">',
        "<head>",
        f"<title>{escape(doc.filename or doc.sha256)}</title>",
        '<meta http-equiv="Content-Type" content="text/html;charset=utf-8"/>',
        '<meta name="ocr-system" content="ocrfleet"/>',
        '<meta name="ocr-capabilities" content="ocr_page ocr_carea ocr_line ocrx_word"/>',
        "</head>",
        "<body>",
    ]
    for page in doc.pages:
        p = page.number
        full = ir.BBox(x0=0, y0=0, x1=page.width, y1=page.height)
        out.append(
            f'<div class="ocr_page" id="page_{p}" '
            f'title="{_bbox(full)}; ppageno {p - 1}">'
        )
        for region in page.regions:
            r = region.region.number
            flag = region.awaiting_review
            flag_attr = "" if flag is None else f' data-flag="{escape(flag)}"'
            out.append(
                f'<div class="ocr_carea" id="block_{p}_{r}" title="{_bbox(region.region.bbox)}"'
                f' data-category="{region.category}"{flag_attr}>'
            )
            verified = region.verified
            for n, line in enumerate(region.lines, start=1):
                out.append(
                    f'<span class="ocr_line" id="line_{p}_{r}_{n}" title="{_bbox(line.bbox)}">'
                )
                spans = []
                for w, word in enumerate(line.words, start=1):
                    title = _bbox(word.bbox)
                    if verified is not None:
                        title += f"; x_wconf {round(verified * 100)}"
                    spans.append(
                        f'<span class="ocrx_word" id="word_{p}_{r}_{n}_{w}" title="{title}">'
                        f"{escape(word.text)}</span>"
                    )
                out.append(" ".join(spans))
                out.append("</span>")
            out.append("</div>")
        out.append("</div>")
    out += ["</body>", "</html>", ""]
    return "\n".join(out)
