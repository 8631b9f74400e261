"""A small HTML reader for report tests: headings, images, resource references and table rows."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser


class Page(HTMLParser):
    def __init__(self, text: str):
        super().__init__()
        self.h2: list[str] = []
        self.images: list[str] = []
        self.refs: list[tuple[str, str, str]] = []  # (tag, attribute, value) of every src/href
        self.tables: dict[str, list[list[str]]] = {}  # table class -> body rows (cells as text)
        self.tags: set[str] = set()
        self._in_h2 = False
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        attrs = dict(attrs)
        for name in ("src", "href"):
            if name in attrs:
                self.refs.append((tag, name, attrs[name] or ""))
        if tag == "h2":
            self._in_h2 = True
            self.h2.append("")
        elif tag == "img":
            self.images.append(attrs.get("src", ""))
        elif tag == "table":
            self._table = attrs.get("class") or f"table{len(self.tables)}"
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "h2":
            self._in_h2 = False
        elif tag == "td" and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row and self._table:  # header rows have no <td>
                self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._in_h2:
            self.h2[-1] += data
        if self._cell is not None:
            self._cell.append(data)


def decoded_svgs(page: Page) -> list[str]:
    out = []
    for src in page.images:
        if src.startswith("data:image/svg+xml;base64,"):
            out.append(base64.b64decode(src.split(",", 1)[1]).decode("utf-8"))
    return out


SVG_RESOURCE = re.compile(r'(?:xlink:)?href="(?!#|data:)([^"]*)"|url\((?!#|data:)[^)]*\)')


def svg_resources(svg: str) -> list[str]:
    """References inside an SVG that would load something (not same-document #ids, not data: URIs, which
    carry what they show: a rasterized line is an embedded PNG).

    The xmlns="http://www.w3.org/2000/svg" namespace and the metadata's rdf:resource URIs name things;
    they load nothing, so they are not counted.
    """
    return [m.group(0) for m in SVG_RESOURCE.finditer(svg)]
