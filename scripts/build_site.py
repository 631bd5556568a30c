"""A browsable, static HTML edition of the series (`make site` -> build/site/).

Each committed notebook becomes one page with nbconvert's ``lab`` template: its stored outputs
(figures, tables, printed numbers), a list of its headings (its contents) and, where the
notebook has widgets, the stored widget state
(``<script type="application/vnd.jupyter.widget-state+json">``) that the widget manager draws
sliders from. Each worked solution (``notebooks/solutions/*.ipynb``) becomes a page under
``solutions/``, linked from its notebook's page and from the index. The README becomes
``readme.html`` and each ``docs/NAME.md`` becomes ``docs/NAME.html``, rendered by the same
template and Markdown renderer as the notebooks' cells (mistune, through nbconvert: tables,
fenced code, formulas), their headings named as GitHub names them so that ``page.md#heading``
links hold in both places. ``index.html`` links the notebooks in the order of the README's
notebook table, with what each notebook proves and its run time taken from that table (parsed,
never retyped; a "(table below)" that points into the README is dropped), then the README and
the documentation pages, in the order the README links them, each with its first paragraph
(its point). A notebook the table lists that is not in ``notebooks/`` yet is left out with a
warning, and links to it become plain text. Nothing is executed: the pages show the committed
outputs.

Links stay inside the folder, so that it can be published as it is: a notebook's link to
another notebook or to a solution goes to its page; a link to any other file of the repository
(``../gradaccum_course/programs/ddp.py``) goes to a page holding a copy of its text,
``source/<path>.html``; a link to what is not a file of the repository stops the build.
Emoji that a browser without an emoji font draws as a box become words (site_pages.EMOJI_TEXT).

The Chinese edition: each notebook or solution that has a twin in ``notebooks/zh/``
(scripts/build_twins.py) also becomes a page under ``zh/``, and ``README.zh.md`` and
``docs/zh/*.md`` become ``zh/readme.html`` and ``zh/docs/NAME.html``. Each notebook's page links
to its twin's and back; the index lists both editions. The pages name CJK fonts in their font
stack (site_pages.CSS); a machine with none shows boxes (``make doctor`` says which package to
install).

The widgets are drawn by @jupyter-widgets/html-manager and the formulas typeset by MathJax 3,
JavaScript that the pages load (site_vendor.py). ``--widgets`` and ``--mathjax`` say from where:

* ``cdn``: from unpkg.com and cdnjs (widgets), cdn.jsdelivr.net (MathJax); the reader needs
  the internet.
* ``npm``: fetched once with ``npm pack`` (pinned versions in site_vendor.py) into
  ``build/site-vendor/`` and copied next to the pages (``_static/``), so the site works
  offline (from ``file://`` too).
* a directory holding the files (``embed-amd.js`` and ``require.js``; ``tex-chtml-full.js``
  and its fonts): copied next to the pages.
* ``auto`` (the default): the ``build/site-vendor/`` cache if present, else ``npm`` when npm is
  installed and the registry answers, else ``cdn`` (said on stdout).

Usage: python scripts/build_site.py [--out build/site] [--widgets auto|cdn|npm|DIR]
                                    [--mathjax auto|cdn|npm|DIR] [--docs DIR]
"""

from __future__ import annotations

import argparse
import html
import json
import posixpath
import re
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

sys.path.append(str(Path(__file__).resolve().parent))  # site_pages, site_vendor beside it
import site_pages  # noqa: E402
from build_twins import twin_name  # noqa: E402 - a twin's file name: 00_the_article.zh.ipynb
from site_vendor import (  # noqa: E402,F401 - fetch_*, VENDOR_FILES: the tests' entry points
    MATHJAX_CACHE,
    MATHJAX_CDN,
    MATHJAX_ENTRY,
    VENDOR_CACHE,
    VENDOR_FILES,
    copy_static,
    fetch_mathjax,
    fetch_widget_files,
    resolve_mathjax,
    resolve_widgets,
)

ROOT = Path(__file__).resolve().parent.parent
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
NOTEBOOK_NAME = re.compile(r"\d\d[a-z]?_[a-z0-9_]+\.ipynb")  # 04_..., 04b_...
TABLE_HEADING = "## The notebooks"
SOLUTIONS = "solutions"  # the worked solutions' folder, in notebooks/ and in the site
DOCS = "docs"  # the Markdown pages' folder, beside README.md and in the site
README_PAGE = "readme.html"
DOCS_HEADING = "## Documentation"  # the README's list of its pages
DOCS_LINK = re.compile(r"\]\((docs/[^)#\s]+\.md)")  # the README's links to its pages


@dataclass(frozen=True)
class Entry:
    """One row of the README's notebook table."""

    notebook: str  # file name, e.g. 01_the_math.ipynb
    proves: str  # the "what it proves" cell, markdown
    run_time: str  # the time cell, e.g. "~5 s"


@dataclass(frozen=True)
class Table:
    time_header: str  # the time column's header, e.g. "CPU time (`ci` profile, 2 cores)"
    entries: list[Entry]


def _cells(line: str) -> list[str]:
    """A markdown table row's cells (``\\|`` inside a cell is not a separator)."""
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", inner)]


def parse_notebook_table(readme: str) -> Table:
    """The notebook table under the README's ``## The notebooks`` heading.

    Columns are found by their headers (one containing "notebook", one "prove", one "time");
    the notebook cell may be a bare name or a link. Raises ValueError saying what is missing.
    """
    lines = readme.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == TABLE_HEADING)
    except StopIteration:
        raise ValueError(f"README.md has no {TABLE_HEADING!r} section") from None
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.lstrip().startswith("|"):
            rows.append(_cells(line))
        elif rows:
            break  # the table has ended
    if len(rows) < 3:
        raise ValueError(f"README.md: no notebook table under {TABLE_HEADING!r}")
    header = [cell.lower() for cell in rows[0]]

    def column(word: str) -> int:
        try:
            return next(i for i, cell in enumerate(header) if word in cell)
        except StopIteration:
            raise ValueError(f"README.md's notebook table has no column whose header "
                             f"contains {word!r}: {rows[0]}") from None

    name_col, proves_col, time_col = column("notebook"), column("prove"), column("time")
    entries = []
    for row in rows[2:]:  # rows[1] is the |---| separator
        if len(row) != len(header):
            raise ValueError(f"README.md's notebook table: a row has {len(row)} cells, the "
                             f"header {len(header)}: {row}")
        names = NOTEBOOK_NAME.findall(row[name_col])
        if len(set(names)) != 1:
            raise ValueError(f"README.md's notebook table: cannot tell the notebook in "
                             f"{row[name_col]!r}")
        entries.append(Entry(names[0], row[proves_col], row[time_col]))
    return Table(rows[0][time_col], entries)


def order_entries(entries: list[Entry], notebooks: Path) -> tuple[list[Entry], list[str]]:
    """The table's entries, each notebook of ``notebooks`` once, and warnings.

    A notebook listed twice raises ValueError. A notebook listed in the table but absent (one
    being written) is left out, with a warning. A notebook the table does not list yet is
    still published, placed by its file name, with a warning: the site is never missing a
    notebook.
    """
    listed = [entry.notebook for entry in entries]
    present = sorted(path.name for path in notebooks.glob("*.ipynb"))
    twice = sorted({name for name in listed if listed.count(name) > 1})
    if twice:
        raise ValueError(f"README.md's notebook table lists notebooks twice: {twice}")
    ordered = [entry for entry in entries if entry.notebook in present]
    warnings = [f"warning: {name} is in README.md's notebook table but not in {notebooks}; "
                "not published, links to it left as text"
                for name in listed if name not in present]
    for name in sorted(set(present) - set(listed)):
        later = [i for i, entry in enumerate(ordered) if entry.notebook > name]
        ordered.insert(later[0] if later else len(ordered),
                       Entry(name, "(not described in README.md's notebook table yet)", "?"))
        warnings.append(f"warning: {name} is not in README.md's notebook table; published "
                        "without its description and run time")
    return ordered, warnings


def notebook_title(notebook: dict, fallback: str) -> str:
    """The first markdown heading of the notebook (without the #s), else ``fallback``."""
    for cell in notebook["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        for line in source.splitlines():
            if line.startswith("#"):
                return line.lstrip("#").strip()
    return fallback


def has_widgets(notebook: dict) -> bool:
    return WIDGET_STATE in notebook.get("metadata", {}).get("widgets", {})


# --------------------------------------------------------------------------------- the pages


@dataclass(frozen=True, eq=False)
class Page:
    """One notebook's page."""

    notebook: str  # its path under notebooks/, e.g. solutions/01_the_math_solutions.ipynb
    page: str  # its path in the site, e.g. solutions/01_the_math_solutions.html
    title: str
    node: dict  # the notebook (nbformat's NotebookNode)
    entry: Entry | None  # its row of the README's table; None for a solution
    solutions: str | None = None  # a notebook's: its solutions' page
    exercises: str | None = None  # a solution's: its notebook's page
    twin: str | None = None  # an English page's: its Chinese twin's page


def _html(notebook: str) -> str:
    return notebook.removesuffix(".ipynb") + ".html"


def _load(notebooks: Path, entries: list[Entry]) -> list[Page]:
    """The notebooks in the table's order, then their solutions (any others by name)."""
    import nbformat

    def read(notebook: str, entry: Entry | None, **links: str | None) -> Page:
        node = nbformat.read(notebooks / notebook, as_version=4)
        return Page(notebook, _html(notebook), notebook_title(node, Path(notebook).name), node,
                    entry, **links)

    exercises = {entry.notebook.removesuffix(".ipynb") + "_solutions.ipynb": entry.notebook
                 for entry in entries}  # a solution's name -> its notebook
    order = list(exercises)
    solved = sorted(path.name for path in (notebooks / SOLUTIONS).glob("*.ipynb"))
    solved.sort(key=lambda name: order.index(name) if name in exercises else len(order))
    pages = [read(entry.notebook, entry, solutions=f"{SOLUTIONS}/{_html(solution)}"
                  if solution in solved else None)
             for solution, entry in zip(order, entries, strict=True)]
    for name in solved:
        pages.append(read(f"{SOLUTIONS}/{name}", None,
                          exercises=_html(exercises[name]) if name in exercises else None))
    return pages


ZH = "zh"  # the Chinese edition's folder, in notebooks/ and in the site


def _load_twins(notebooks: Path, pages: list[Page]) -> dict[str, Page]:
    """{an English page's path: its Chinese twin's Page}, for each twin in notebooks/zh/."""
    import nbformat

    twins = {}
    for page in pages:
        twin = twin_name(PurePosixPath(page.notebook))
        path = notebooks / ZH / twin
        if not path.is_file():
            continue
        node = nbformat.read(path, as_version=4)
        twins[page.page] = Page(f"{ZH}/{twin}", f"{ZH}/{page.page}",
                                notebook_title(node, Path(page.notebook).name), node, page.entry,
                                solutions=page.solutions, exercises=page.exercises)
    return twins


def _exercises_anchor(node: dict) -> str:
    """The anchor of a notebook's exercises heading ("Exercises", or its translation): the
    last level-2 heading of the notebook."""
    headings = [line[3:].strip() for cell in node["cells"] if cell["cell_type"] == "markdown"
                for line in "".join(cell["source"]).splitlines() if line.startswith("## ")]
    return re.sub(r"\s", "-", headings[-1]) if headings else "Exercises"


def _twin_nav(twin: Page, english: Page, twins: list[Page]) -> str:
    """The links atop a Chinese twin's page: the index, the English page, the previous and
    next twins, the solutions (or the exercises)."""
    root = site_pages.up(twin.page)
    links = [(root + "index.html", "&#8962; 全部笔记本 / all notebooks"),
             (root + english.page, "English")]
    numbered = [page for page in twins if page.entry is not None]
    if twin.exercises:
        notebook = next((page for page in twins if page.page == f"{ZH}/{twin.exercises}"), None)
        if notebook is not None:
            links.append((f"{root}{notebook.page}#{_exercises_anchor(notebook.node)}",
                          f"&larr; {html.escape(notebook.title)} 的练习"))
    if twin in numbered:
        i = numbered.index(twin)
        if i > 0:
            links.append((root + numbered[i - 1].page,
                          f"&larr; {html.escape(numbered[i - 1].title)}"))
        if i + 1 < len(numbered):
            links.append((root + numbered[i + 1].page,
                          f"{html.escape(numbered[i + 1].title)} &rarr;"))
    if twin.solutions and (f"{ZH}/{twin.solutions}" in {page.page for page in twins}):
        links.append((twin.solutions, "练习的参考答案"))
    return site_pages.nav(links)


def _nav(page: Page, notebooks: list[Page]) -> str:
    """The links atop ``page``: the index, the previous and next notebooks and the solutions;
    for a solution, the exercises of its notebook."""
    root = site_pages.up(page.page)
    links = [(root + "index.html", "&#8962; all notebooks")]
    if page.exercises:
        notebook = next(other for other in notebooks if other.page == page.exercises)
        links.append((f"{root}{notebook.page}#Exercises",
                      f"&larr; the exercises of {html.escape(notebook.title)}"))
    if page.entry is not None:
        i = notebooks.index(page)
        if i > 0:
            links.append((notebooks[i - 1].page, f"&larr; {html.escape(notebooks[i - 1].title)}"))
        if i + 1 < len(notebooks):
            links.append((notebooks[i + 1].page,
                          f"{html.escape(notebooks[i + 1].title)} &rarr;"))
    if page.solutions:
        links.append((page.solutions, "solutions to the exercises"))
    if page.twin:
        links.append((root + page.twin, "中文版"))
    return site_pages.nav(links)


def _index_row(page: Page, links: site_pages.Links) -> str:
    extra = (" &middot; with sliders" if has_widgets(page.node) else "") + (
        f' &middot; <a href="{page.solutions}">solutions</a>' if page.solutions else "")
    proves = site_pages.markdown(site_pages.without_self_references(page.entry.proves))
    return (f"<tr><td><a href=\"{page.page}\">{site_pages.inline(page.title)}</a><br>"
            f"<span class='note'><code>{page.entry.notebook}</code>{extra}</span></td>"
            f"<td>{links.rewrite(proves, '', 'index.html')}</td>"
            f"<td class='time'>{html.escape(page.entry.run_time)}</td></tr>")


# ------------------------------------------------------------------ the README and docs/*.md


@dataclass(frozen=True)
class Document:
    """A Markdown page of the repository: the README or a page of docs/."""

    source: str  # its path in the repository, e.g. docs/running.md
    page: str  # its path in the site, e.g. docs/running.html
    title: str
    text: str  # its Markdown

    @property
    def point(self) -> str:
        return site_pages.markdown_point(self.text)


def documents(readme: Path, docs: Path) -> list[Document]:
    """The README, then each ``docs/*.md`` page in the order of the README's links: those of
    its ``## Documentation`` section first, then the others by first link, then the pages it
    does not link, by name."""
    readme_text = readme.read_text(encoding="utf-8")
    section = readme_text.partition(f"\n{DOCS_HEADING}\n")[2].split("\n## ", 1)[0]
    order = list(dict.fromkeys(DOCS_LINK.findall(section) + DOCS_LINK.findall(readme_text)))
    names = sorted(path.name for path in docs.glob("*.md")) if docs.is_dir() else []
    names.sort(key=lambda name: (order.index(f"{DOCS}/{name}") if f"{DOCS}/{name}" in order
                                 else len(order)))
    pages = [Document("README.md", README_PAGE, "README", readme_text)]
    for name in names:
        text = (docs / name).read_text(encoding="utf-8")
        pages.append(Document(f"{DOCS}/{name}", f"{DOCS}/{name.removesuffix('.md')}.html",
                              site_pages.markdown_title(text, name), text))
    return pages


def chinese_documents(repo: Path) -> list[Document]:
    """The Chinese edition's Markdown pages: README.zh.md, then docs/zh/*.md by name."""
    readme = repo / "README.zh.md"
    if not readme.is_file():
        return []
    pages = [Document("README.zh.md", f"{ZH}/{README_PAGE}", "README（中文）",
                      readme.read_text(encoding="utf-8"))]
    for path in sorted((repo / DOCS / ZH).glob("*.md")):
        text = path.read_text(encoding="utf-8")
        pages.append(Document(f"{DOCS}/{ZH}/{path.name}",
                              f"{ZH}/{DOCS}/{path.name.removesuffix('.md')}.html",
                              site_pages.markdown_title(text, path.name), text))
    return pages


def _zh_document_nav(document: Document) -> str:
    root = site_pages.up(document.page)
    return site_pages.nav([(root + "index.html", "&#8962; 全部笔记本 / all notebooks"),
                           (root + f"{ZH}/{README_PAGE}", "README（中文）"),
                           (root + README_PAGE, "README (English)")])


def _zh_row(twin: Page, english: Page) -> str:
    return (f"<tr><td><a href=\"{twin.page}\">{site_pages.inline(twin.title)}</a><br>"
            f"<span class='note'><code>notebooks/{html.escape(twin.notebook)}</code></span></td>"
            f"<td>English: <a href=\"{english.page}\">{site_pages.inline(english.title)}</a>"
            "</td></tr>")


def _document_node(document: Document):  # noqa: ANN202 - nbformat's NotebookNode
    """A one-cell notebook holding ``document``'s Markdown, for the notebooks' exporter."""
    import nbformat

    node = nbformat.v4.new_notebook()
    node.cells = [nbformat.v4.new_markdown_cell(document.text)]
    return node


def _document_nav(document: Document, pages: list[Document]) -> str:
    root = site_pages.up(document.page)
    links = [(root + "index.html", "&#8962; all notebooks")]
    if document.page != README_PAGE:
        links.append((root + README_PAGE, "README"))
    i = pages.index(document)
    if i > 1:  # the page before, among the documentation pages
        links.append((root + pages[i - 1].page, f"&larr; {site_pages.inline(pages[i - 1].title)}"))
    if 0 < i < len(pages) - 1:
        links.append((root + pages[i + 1].page, f"{site_pages.inline(pages[i + 1].title)} &rarr;"))
    return site_pages.nav(links)


def _document_row(document: Document, links: site_pages.Links) -> str:
    point = site_pages.markdown(document.point)
    folder = posixpath.dirname(document.source)
    return (f"<tr><td><a href=\"{document.page}\">{site_pages.inline(document.title)}</a><br>"
            f"<span class='note'><code>{html.escape(document.source)}</code></span></td>"
            f"<td>{links.rewrite(point, folder, 'index.html')}</td></tr>")


def build(out: Path, notebooks: Path = ROOT / "notebooks", readme: Path = ROOT / "README.md",
          widgets: str = "auto", cache: Path = VENDOR_CACHE, mathjax: str = "auto",
          mathjax_cache: Path = MATHJAX_CACHE, repo: Path = ROOT,
          docs: Path | None = None) -> list[Path]:
    """Write the site into ``out``; returns the pages: the index, the notebooks', the
    solutions', the README's and the documentation pages', then the source files'. The
    Markdown pages are read from ``docs`` (default: the ``docs/`` beside ``readme``); other
    files the pages link are read from ``repo``."""
    readme_text = readme.read_text(encoding="utf-8")
    table = parse_notebook_table(readme_text)
    entries, warnings = order_entries(table.entries, notebooks)
    for warning in warnings:
        print(warning, flush=True)
    # being written: notebooks the table lists that are not there yet, and worked solutions
    # not there yet (tests/test_exercises.py requires one per notebook); links to them: text
    pending = {f"notebooks/{entry.notebook}" for entry in table.entries} - {
        f"notebooks/{entry.notebook}" for entry in entries}
    pending |= {f"notebooks/{SOLUTIONS}/{solution}" for solution in (
        entry.notebook.removesuffix(".ipynb") + "_solutions.ipynb" for entry in entries)
        if not (notebooks / SOLUTIONS / solution).is_file()}
    markdown_pages = documents(readme, readme.parent / DOCS if docs is None else docs)
    widget_folder, widget_note = resolve_widgets(widgets, cache)
    mathjax_folder, mathjax_note = resolve_mathjax(mathjax, mathjax_cache)
    out.mkdir(parents=True, exist_ok=True)
    widgets_url = copy_static(out, "widgets", widget_folder)
    mathjax_dir = copy_static(out, "mathjax", mathjax_folder)
    for folder in (SOLUTIONS, DOCS, "source"):  # written afresh: nothing stale is published
        shutil.rmtree(out / folder, ignore_errors=True)

    def mathjax_url(root: str) -> str:
        return MATHJAX_CDN if mathjax_dir is None else f"{root}{mathjax_dir}/{MATHJAX_ENTRY}"

    def write(page: str, text: str) -> Path:
        path = out / page
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(site_pages.as_text(text), encoding="utf-8")
        return path

    pages = _load(notebooks, entries)
    twins = _load_twins(notebooks, pages)
    twin_of = {page.page: twins[page.page] for page in pages if page.page in twins}
    pages = [replace(page, twin=twin_of[page.page].page if page.page in twin_of else None)
             for page in pages]
    english_of = {twin.page: page for page in pages for twin in [twin_of.get(page.page)] if twin}
    twin_pages = list(twin_of.values())
    zh_documents = chinese_documents(readme.parent)
    numbered = [page for page in pages if page.entry is not None]
    links = site_pages.Links(repo, {
        **{f"notebooks/{page.notebook}": page.page for page in pages + twin_pages},
        **{document.source: document.page for document in markdown_pages + zh_documents}},
        pending)
    exporters = {}
    written = []
    for page in pages:
        root = site_pages.up(page.page)
        if root not in exporters:  # the widget files' path depends on the page's folder
            exporters[root] = site_pages.exporter(widgets_url and root + widgets_url)
        body, _ = exporters[root].from_notebook_node(page.node, resources={
            "metadata": {"name": page.title, "path": str(notebooks)},
            "site_mathjax": site_pages.mathjax_head(mathjax_url(root)),
            "site_css": site_pages.CSS})
        body = links.rewrite(body, posixpath.dirname(f"notebooks/{page.notebook}"), page.page)
        body = body.replace("<main>", "<main>\n" + _nav(page, numbered)
                            + site_pages.contents(body), 1)
        written.append(write(page.page, body))
    for twin in twin_pages:
        root = site_pages.up(twin.page)
        if root not in exporters:
            exporters[root] = site_pages.exporter(widgets_url and root + widgets_url)
        body, _ = exporters[root].from_notebook_node(twin.node, resources={
            "metadata": {"name": twin.title, "path": str(notebooks / ZH)},
            "site_mathjax": site_pages.mathjax_head(mathjax_url(root)),
            "site_css": site_pages.CSS})
        body = links.rewrite(body, posixpath.dirname(f"notebooks/{twin.notebook}"), twin.page)
        body = body.replace("<main>", "<main>\n" + _twin_nav(twin, english_of[twin.page],
                                                              twin_pages)
                            + site_pages.contents(body), 1)
        written.append(write(twin.page, site_pages.chinese(body)))
    for document in markdown_pages + zh_documents:
        root = site_pages.up(document.page)
        if root not in exporters:
            exporters[root] = site_pages.exporter(widgets_url and root + widgets_url)
        body, _ = exporters[root].from_notebook_node(_document_node(document), resources={
            "metadata": {"name": document.title, "path": str(readme.parent)},
            "site_mathjax": site_pages.mathjax_head(mathjax_url(root)),
            "site_css": site_pages.CSS})
        body = site_pages.github_ids(body)
        body = links.rewrite(body, posixpath.dirname(document.source), document.page)
        document_nav = (_document_nav(document, markdown_pages) if document in markdown_pages
                         else _zh_document_nav(document))
        body = body.replace("<main>", "<main>\n" + document_nav + site_pages.contents(body), 1)
        written.append(write(document.page, body if document in markdown_pages
                             else site_pages.chinese(body)))
    rows = [_index_row(page, links) for page in numbered]
    doc_rows = [_document_row(document, links) for document in markdown_pages]
    zh_rows = [_zh_row(twin, english_of[twin.page]) for twin in twin_pages
               if twin.entry is not None] + [_document_row(document, links)
                                             for document in zh_documents]
    for path, named_from in sorted(links.unlinked.items()):
        print(f"warning: {path} is not written yet: named as text, unlinked, in "
              f"{', '.join(dict.fromkeys(named_from))}", flush=True)
    titles = {page.page: page.title for page in pages + twin_pages} | {
        document.page: document.title for document in markdown_pages + zh_documents} | {
        "index.html": "the index"}
    for repo_path in sorted(links.images):  # the images the pages show, as they are
        target = out / site_pages.IMAGES / repo_path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(repo / repo_path, target)
    for repo_path, linked_from in links.sources.items():
        try:
            text = (repo / repo_path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{linked_from[0]} links {repo_path}, which is not a text "
                             "file") from None
        written.append(write(site_pages.source_page_path(repo_path), site_pages.source_page(
            repo_path, text, [(page, titles[page]) for page in linked_from])))
    readme_title = next((line.lstrip("#").strip() for line in readme_text.splitlines()
                         if line.startswith("# ")), "gradaccum")
    index = write("index.html", site_pages.index_page(
        readme_title, table.time_header, rows, mathjax_url(""),
        [widget_note, f"formulas typeset by {mathjax_note}"], doc_rows, zh_rows))
    (out / "pages.json").write_text(json.dumps([{
        "notebook": page.notebook, "page": page.page, "title": page.title,
        "widgets": has_widgets(page.node), "run_time": page.entry and page.entry.run_time,
        "solutions": page.solutions, "twin": page.twin} for page in pages] + [{
        "notebook": twin.notebook, "page": twin.page, "title": twin.title,
        "widgets": has_widgets(twin.node), "run_time": twin.entry and twin.entry.run_time,
        "solutions": twin.solutions, "english": english_of[twin.page].page}
        for twin in twin_pages] + [{
        "markdown": document.source, "page": document.page, "title": document.title,
        "widgets": False} for document in markdown_pages + zh_documents], indent=1,
        ensure_ascii=False)
        + "\n", encoding="utf-8")
    print(widget_note, flush=True)
    print(f"formulas: {mathjax_note}", flush=True)
    return [index, *written]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site")
    parser.add_argument("--notebooks", type=Path, default=ROOT / "notebooks")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--docs", type=Path, default=None,
                        help="the Markdown pages' folder (default: docs/ beside the README)")
    parser.add_argument("--widgets", default="auto",
                        help="auto (default), cdn, npm, or a folder with embed-amd.js and "
                             "require.js")
    parser.add_argument("--mathjax", default="auto",
                        help=f"auto (default), cdn, npm, or a folder with {MATHJAX_ENTRY} "
                             "and its fonts")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        pages = build(args.out, args.notebooks, args.readme, args.widgets,
                      mathjax=args.mathjax, docs=args.docs)
    except (ValueError, RuntimeError, OSError) as error:
        print(f"build_site: {error}", file=sys.stderr)
        return 1
    kinds = [path.relative_to(args.out).parts for path in pages[1:]]
    notebook_pages = sum(len(parts) == 1 and parts[0] != README_PAGE for parts in kinds)
    solution_pages = sum(parts[0] == SOLUTIONS for parts in kinds)
    doc_pages = sum(parts[0] == DOCS or parts == (README_PAGE,) for parts in kinds)
    print(f"{notebook_pages} notebooks -> {pages[0]} ({solution_pages} solution pages, "
          f"{doc_pages} Markdown pages, {len(kinds) - notebook_pages - solution_pages - doc_pages}"
          f" source files) in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
