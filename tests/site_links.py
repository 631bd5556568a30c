"""Every link of a built site (scripts/build_site.py), checked: for tests/test_site.py and the
browser test.

Each ``href`` and ``src`` of every HTML file under the site is read with Python's HTML parser.
Absolute http(s), mailto and data URLs are not followed (``//host/...`` counts as http(s)); any
other link must be relative, stay inside the site (no ``../`` past its root), and name a file
that exists, ``#anchor`` and ``?query`` aside. ``broken_anchors`` additionally checks that each
``page#anchor`` inside the site names an ``id`` of that page.
"""

from __future__ import annotations

import posixpath
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

EXTERNAL = re.compile(r"^(?:https?:|mailto:|data:|//)", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.urls: list[tuple[str, str]] = []  # (tag.attribute, value)
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in {"href", "src"}:
                self.urls.append((f"{tag}.{name}", value))
            elif name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value)


def _read(path: Path) -> _Collector:
    collector = _Collector()
    collector.feed(path.read_text(encoding="utf-8"))
    collector.close()
    return collector


def _resolve(site: Path, page: Path, url: str) -> tuple[str | None, str, str | None]:
    """(the target's path relative to the site or None when not checked, the fragment, the
    problem or None)."""
    if EXTERNAL.match(url) or url.startswith("#"):
        return None, "", None
    if SCHEME.match(url):
        return None, "", "a scheme other than http(s), mailto and data"
    if url.startswith("/"):
        return None, "", "absolute path (leaves the site once published)"
    path, _, fragment = url.partition("#")
    path = path.partition("?")[0]
    here = page.parent.relative_to(site).as_posix()
    target = posixpath.normpath(posixpath.join(here, unquote(path)))
    if target == ".." or target.startswith("../"):
        return None, fragment, "leaves the site's folder"
    file = site / target
    if file.is_dir():
        file, target = file / "index.html", posixpath.join(target, "index.html")
    if not file.is_file():
        return None, fragment, "no such file in the site"
    return target, fragment, None


def html_files(site: Path) -> list[Path]:
    return sorted(site.rglob("*.html"))


def broken_links(site: Path) -> list[str]:
    """'page: tag.attribute="url" (why)' for each link that fails; [] when all hold."""
    problems = []
    for page in html_files(site):
        for where, url in _read(page).urls:
            _, _, problem = _resolve(site, page, url)
            if problem:
                problems.append(f"{page.relative_to(site)}: {where}={url!r} ({problem})")
    return problems


def broken_anchors(site: Path) -> list[str]:
    """'page: href (why)' for each link to ``page#anchor`` in the site (or ``#anchor`` on the
    same page) whose page has no element with that id."""
    ids: dict[str, set[str]] = {}

    def ids_of(target: str) -> set[str]:
        if target not in ids:
            found = _read(site / target).ids
            ids[target] = found | {unquote(ident) for ident in found}
        return ids[target]

    problems = []
    for page in html_files(site):
        for where, url in _read(page).urls:
            if where != "a.href" or "#" not in url:
                continue
            if url.startswith("#"):
                target, fragment = page.relative_to(site).as_posix(), url[1:]
            else:
                target, fragment, problem = _resolve(site, page, url)
                if target is None or problem or not target.endswith(".html"):
                    continue
            if fragment and unquote(fragment) not in ids_of(target):
                problems.append(f"{page.relative_to(site)}: {url!r} (no id {fragment!r} "
                                f"in {target})")
    return problems
