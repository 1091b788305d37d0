"""A small element tree of an HTML page (stdlib html.parser), for the docs tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str | None]
    children: list[Node | str] = field(default_factory=list)
    parent: Node | None = None

    def text(self) -> str:
        out = []
        for c in self.children:
            out.append(c if isinstance(c, str) else c.text())
        return "".join(out)

    def iter(self, tag: str | None = None):
        for c in self.children:
            if isinstance(c, Node):
                if tag is None or c.tag == tag:
                    yield c
                yield from c.iter(tag)

    def find_all(self, tag: str, cls: str | None = None) -> list[Node]:
        return [n for n in self.iter(tag) if cls is None or cls in (n.attrs.get("class") or "").split()]

    def find(self, tag: str, cls: str | None = None, id: str | None = None) -> Node | None:
        for n in self.iter(tag):
            if cls is not None and cls not in (n.attrs.get("class") or "").split():
                continue
            if id is not None and n.attrs.get("id") != id:
                continue
            return n
        return None


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        n = Node(tag, dict(attrs), parent=self.cur)
        self.cur.children.append(n)
        if tag not in VOID:
            self.cur = n

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, dict(attrs), parent=self.cur))

    def handle_endtag(self, tag):
        n = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def parse(text: str) -> Node:
    b = _Builder()
    b.feed(text)
    b.close()
    return b.root


def rows(table: Node) -> list[list[str]]:
    """The text of each data row's cells (header rows skipped)."""
    out = []
    for tr in table.iter("tr"):
        cells = [c for c in tr.children if isinstance(c, Node) and c.tag in ("td", "th")]
        if cells and all(c.tag == "td" for c in cells):
            out.append([" ".join(c.text().split()) for c in cells])
    return out
