"""A browsable, static HTML edition of the series (`make site` -> build/site/).

Each committed notebook becomes one page with nbconvert's ``lab`` template: its stored outputs
(figures, tables, printed numbers) and, where the notebook has widgets, the stored widget state
(``<script type="application/vnd.jupyter.widget-state+json">``) that the widget manager draws
sliders from. ``index.html`` links the pages in the order of the README's notebook table, with
what each notebook proves and its run time taken from that table (parsed, never retyped).
Nothing is executed: the pages show the committed outputs.

The widgets are drawn by @jupyter-widgets/html-manager, a JavaScript bundle that the page
loads. ``--widgets`` says from where:

* ``cdn``: from unpkg.com and cdnjs (nbconvert's default); the reader needs the internet.
* ``npm``: fetched once with ``npm pack`` (pinned versions below) into ``build/site-vendor/``
  and copied next to the pages, so the site works offline (from ``file://`` too).
* a directory holding ``embed-amd.js`` and ``require.js``: copied next to the pages.
* ``auto`` (the default): the ``build/site-vendor/`` cache if present, else ``npm`` when npm is
  installed and the registry answers, else ``cdn`` (said on stdout).

Formulas are typeset by MathJax, always from cdnjs: offline, the TeX source shows.

Usage: python scripts/build_site.py [--out build/site] [--widgets auto|cdn|npm|DIR]
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR_CACHE = ROOT / "build" / "site-vendor"
# the widget manager that matches ipywidgets 8.1 (widget state version 2), and an AMD loader
HTML_MANAGER = "@jupyter-widgets/html-manager@1.0.15"
REQUIREJS = "requirejs@2.3.7"
VENDOR_FILES = ("embed-amd.js", "require.js")
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
NOTEBOOK_NAME = re.compile(r"\d\d_[a-z0-9_]+\.ipynb")
TABLE_HEADING = "## The notebooks"


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

    A notebook listed in the table but absent, or listed twice, raises ValueError. A notebook
    the table does not list yet is still published, placed by its file name, with a warning:
    the site is never missing a notebook.
    """
    listed = [entry.notebook for entry in entries]
    present = sorted(path.name for path in notebooks.glob("*.ipynb"))
    missing = sorted(set(listed) - set(present))
    twice = sorted({name for name in listed if listed.count(name) > 1})
    problems = ([f"listed but not in {notebooks}: {missing}"] if missing else []) + (
        [f"listed twice: {twice}"] if twice else [])
    if problems:
        raise ValueError("README.md's notebook table and the notebooks disagree: "
                         + "; ".join(problems))
    ordered = list(entries)
    warnings = []
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


# ---------------------------------------------------------------- the widget manager's files


def _npm_pack(package: str, into: Path) -> Path:
    """``npm pack package`` into ``into``, unpacked; returns the package folder."""
    result = subprocess.run(["npm", "pack", "--silent", package], cwd=into, capture_output=True,
                            text=True, timeout=300, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"`npm pack {package}` failed: {result.stderr.strip()[-500:]}")
    archive = into / result.stdout.strip().splitlines()[-1]
    target = into / archive.name.removesuffix(".tgz")
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    return target / "package"


def fetch_widget_files(cache: Path = VENDOR_CACHE) -> Path:
    """The pinned html-manager (``embed-amd.js`` and its fonts) and ``require.js`` in ``cache``,
    fetched with ``npm pack`` unless already there. Returns ``cache``."""
    if all((cache / name).is_file() for name in VENDOR_FILES):
        return cache
    if shutil.which("npm") is None:
        raise RuntimeError("npm is not installed (Debian: apt-get install npm)")
    with tempfile.TemporaryDirectory() as scratch:
        manager = _npm_pack(HTML_MANAGER, Path(scratch))
        requirejs = _npm_pack(REQUIREJS, Path(scratch))
        partial = cache.with_name(cache.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for path in (manager / "dist").iterdir():
            # the AMD bundle and the icon fonts its CSS loads; not the standalone bundle or maps
            if path.name == "embed-amd.js" or path.suffix in {".woff2", ".woff", ".ttf", ".eot",
                                                              ".svg"}:
                shutil.copy2(path, partial / path.name)
        shutil.copy2(requirejs / "require.js", partial / "require.js")
        (partial / "VERSIONS").write_text(f"{HTML_MANAGER}\n{REQUIREJS}\n")
        shutil.rmtree(cache, ignore_errors=True)
        partial.rename(cache)  # complete or absent, never half there
    return cache


def resolve_widgets(choice: str, cache: Path = VENDOR_CACHE) -> tuple[Path | None, str]:
    """The folder of widget files to copy (None: load them from the CDN) and a sentence on it."""
    if choice == "cdn":
        return None, "widget JavaScript from unpkg.com and cdnjs (the reader needs the internet)"
    if choice not in {"auto", "npm"}:
        folder = Path(choice)
        absent = [name for name in VENDOR_FILES if not (folder / name).is_file()]
        if absent:
            raise ValueError(f"--widgets {choice}: not a folder holding {', '.join(absent)} "
                             "(or use auto, cdn, npm)")
        return folder, f"widget JavaScript copied from {folder} (works offline)"
    try:
        folder = fetch_widget_files(cache)
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        if choice == "npm":
            raise
        return None, (f"widget JavaScript from unpkg.com and cdnjs: the offline copy could not "
                      f"be fetched ({error})")
    return folder, f"widget JavaScript ({HTML_MANAGER}, {REQUIREJS}) next to the pages " \
                   "(works offline)"


# --------------------------------------------------------------------------------- the pages

NAV_STYLE = ("font: 14px/1.6 system-ui, sans-serif; padding: 8px 16px; margin-bottom: 8px; "
             "border-bottom: 1px solid #ddd; display: flex; gap: 24px")


def _nav(previous: tuple[str, str] | None, following: tuple[str, str] | None) -> str:
    links = ['<a href="index.html">&#8962; all notebooks</a>']
    if previous:
        links.append(f'<a href="{previous[0]}">&larr; {html.escape(previous[1])}</a>')
    if following:
        links.append(f'<a href="{following[0]}">{html.escape(following[1])} &rarr;</a>')
    return f'<nav class="gradaccum-nav" style="{NAV_STYLE}">{"".join(links)}</nav>'


def _exporter(widgets_url: str | None):  # noqa: ANN202 - nbconvert's HTMLExporter
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab")
    if widgets_url is not None:
        exporter.require_js_url = f"{widgets_url}/require.js"
        exporter.widget_renderer_url = f"{widgets_url}/embed-amd.js"
    return exporter


def _markdown(text: str) -> str:
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    return markdown2html_mistune(text)


def _inline(text: str) -> str:
    """Markdown of one line as inline HTML (no enclosing paragraph)."""
    return _markdown(text).strip().removeprefix("<p>").removesuffix("</p>")


def _index(readme_title: str, table: Table, pages: list[tuple[Entry, str, str, bool]],
           mathjax_url: str, widget_note: str) -> str:
    rows = []
    for entry, page, title, widgets in pages:
        slider = " &middot; with sliders" if widgets else ""
        rows.append(
            f"<tr><td><a href=\"{page}\">{_inline(title)}</a><br>"
            f"<span class='note'><code>{entry.notebook}</code>{slider}</span></td>"
            f"<td>{_markdown(entry.proves)}</td>"
            f"<td class='time'>{html.escape(entry.run_time)}</td></tr>")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{html.escape(readme_title)}</title>
<script type="text/x-mathjax-config">
MathJax.Hub.Config({{tex2jax: {{inlineMath: [['$', '$'], ['\\\\(', '\\\\)']],
                               processEscapes: true}}, messageStyle: 'none'}});
</script>
<script src="{mathjax_url}"></script>
<style>
body {{ font: 16px/1.5 system-ui, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; }}
th, td {{ border-top: 1px solid #ddd; padding: 8px; vertical-align: top; text-align: left; }}
td p {{ margin: 0; }}
td.time {{ white-space: nowrap; }}
.note {{ color: #555; font-size: 14px; }}
</style>
</head>
<body>
<h1>{html.escape(readme_title)}</h1>
<p>The series in reading order, with the outputs as committed (executed under the
<code>ci</code> profile). The sliders show the state they were stored in: moving one here
recomputes nothing, because no Python runs behind a static page; for that, open the notebooks
with <code>make lab</code>.</p>
<table id="notebooks">
<thead><tr><th>notebook</th><th>what it proves</th><th>{_inline(table.time_header)}</th>
</tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody>
</table>
<p class="note">Built by <code>make site</code> (scripts/build_site.py) from README.md and
notebooks/; {html.escape(widget_note)}; formulas typeset by MathJax from cdnjs.</p>
</body>
</html>
"""


def build(out: Path, notebooks: Path = ROOT / "notebooks", readme: Path = ROOT / "README.md",
          widgets: str = "auto", cache: Path = VENDOR_CACHE) -> list[Path]:
    """Write the site into ``out``; returns the pages (index first)."""
    import nbformat

    table = parse_notebook_table(readme.read_text(encoding="utf-8"))
    entries, warnings = order_entries(table.entries, notebooks)
    for warning in warnings:
        print(warning, flush=True)
    folder, widget_note = resolve_widgets(widgets, cache)
    out.mkdir(parents=True, exist_ok=True)
    widgets_url = None
    if folder is not None:
        widgets_url = "_static/widgets"
        target = out / widgets_url
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(folder, target)
    exporter = _exporter(widgets_url)
    loaded = []
    for entry in entries:
        notebook = nbformat.read(notebooks / entry.notebook, as_version=4)
        title = notebook_title(notebook, entry.notebook)
        loaded.append((entry, notebook, title, entry.notebook.removesuffix(".ipynb") + ".html"))
    pages: list[tuple[Entry, str, str, bool]] = []
    written = []
    for i, (entry, notebook, title, page) in enumerate(loaded):
        body, _ = exporter.from_notebook_node(
            notebook, resources={"metadata": {"name": title, "path": str(notebooks)}})
        previous = (loaded[i - 1][3], loaded[i - 1][2]) if i > 0 else None
        following = (loaded[i + 1][3], loaded[i + 1][2]) if i + 1 < len(loaded) else None
        body = body.replace("<main>", "<main>\n" + _nav(previous, following), 1)
        # links between notebooks point at their pages
        body = re.sub(r'href="(\d\d_[a-z0-9_]+)\.ipynb', r'href="\1.html', body)
        (out / page).write_text(body, encoding="utf-8")
        written.append(out / page)
        pages.append((entry, page, title, has_widgets(notebook)))
    readme_title = next((line.lstrip("#").strip() for line in
                         readme.read_text(encoding="utf-8").splitlines()
                         if line.startswith("# ")), "gradaccum")
    index = out / "index.html"
    index.write_text(_index(readme_title, table, pages, exporter.mathjax_url, widget_note),
                     encoding="utf-8")
    (out / "pages.json").write_text(json.dumps(
        [{"notebook": e.notebook, "page": p, "title": t, "widgets": w, "run_time": e.run_time}
         for e, p, t, w in pages], indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(widget_note, flush=True)
    return [index, *written]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site")
    parser.add_argument("--notebooks", type=Path, default=ROOT / "notebooks")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--widgets", default="auto",
                        help="auto (default), cdn, npm, or a folder with embed-amd.js and "
                             "require.js")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        pages = build(args.out, args.notebooks, args.readme, args.widgets)
    except (ValueError, RuntimeError, OSError) as error:
        print(f"build_site: {error}", file=sys.stderr)
        return 1
    print(f"{len(pages) - 1} notebooks -> {pages[0]} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
