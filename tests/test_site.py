"""scripts/build_site.py (`make site`): the static HTML edition and its index.

The real series (a read-only snapshot of notebooks/, notebooks/solutions/, README.md and
docs/) is built once into a temporary folder (about 15 s), with stand-in folders of widget and
MathJax files so that no network is needed; small synthetic inputs cover the parser, the CDN
mode, the links and the Markdown pages. Every link of the built site is walked
(tests/site_links.py).
"""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from script_loader import load_script
from site_links import broken_anchors, broken_links, html_files

ROOT = Path(__file__).resolve().parent.parent
build_site = load_script("scripts/build_site.py")

STATE_SCRIPT = '<script type="application/vnd.jupyter.widget-state+json">'
VIEW_SCRIPT = '<script type="application/vnd.jupyter.widget-view+json">'


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    # a read-only snapshot of the notebooks and README: building must not write them, and
    # edits made meanwhile cannot mix two versions
    source = tmp_path_factory.mktemp("source")
    for folder in ("notebooks", "notebooks/solutions", "notebooks/zh", "notebooks/zh/solutions"):
        (source / folder).mkdir(parents=True)
        for path in (ROOT / folder).glob("*.ipynb"):
            shutil.copy(path, source / folder / path.name)
            (source / folder / path.name).chmod(0o444)
    for name in ("README.md", "README.zh.md"):
        shutil.copy(ROOT / name, source / name)
        (source / name).chmod(0o444)
    for folder in ("docs", "docs/zh"):
        (source / folder).mkdir()
        for path in (ROOT / folder).glob("*.md"):
            shutil.copy(path, source / folder / path.name)
            (source / folder / path.name).chmod(0o444)
    vendor = tmp_path_factory.mktemp("vendor")
    (vendor / "embed-amd.js").write_text("/* stand-in */")
    (vendor / "require.js").write_text("/* stand-in */")
    mathjax = tmp_path_factory.mktemp("mathjax")
    (mathjax / "tex-chtml-full.js").write_text("/* stand-in */")
    out = tmp_path_factory.mktemp("site")
    pages = build_site.build(out, notebooks=source / "notebooks", readme=source / "README.md",
                             widgets=str(vendor), mathjax=str(mathjax))
    return out, pages, source


def _table(source: Path) -> build_site.Table:
    return build_site.parse_notebook_table((source / "README.md").read_text())


def test_index_links_every_notebook_in_the_readme_order(site):
    out, pages, source = site
    index = (out / "index.html").read_text()
    table = _table(source)
    entries, _ = build_site.order_entries(table.entries, source / "notebooks")
    order = [entry.notebook for entry in entries]
    assert sorted(order) == sorted(path.name for path in (source / "notebooks").glob("*.ipynb"))
    present = {path.name for path in (source / "notebooks").glob("*.ipynb")}
    listed = [entry.notebook for entry in table.entries if entry.notebook in present]
    assert [name for name in order if name in listed] == listed  # the README's order
    notebooks_table = index.split('<table id="notebooks">')[1].split("</table>")[0]
    links = re.findall(r'<a href="(\d\d[a-z]?_[a-z0-9_]+\.html)">', notebooks_table)
    assert links == [name.removesuffix(".ipynb") + ".html" for name in order]
    assert [page.name for page in pages[:1 + len(links)]] == ["index.html", *links]
    for link in links:
        assert (out / link).is_file()
    # each row carries the README's run time and what the notebook proves
    rows = index.split('<table id="notebooks">')[1].split("</table>")[0].split("<tr>")[2:]
    by_link = {re.search(r'href="([^"]+)"', row).group(1): row for row in rows}
    for entry in (entry for entry in table.entries if entry.notebook in present):
        row = by_link[entry.notebook.removesuffix(".ipynb") + ".html"]
        assert f"<td class='time'>{html.escape(entry.run_time)}</td>" in row
        words = re.sub(r"[`$\\{}]", "", entry.proves).split()[-4:]
        assert " ".join(words) in html.unescape(re.sub(r"<[^>]+>", "", row)), entry.notebook


def test_each_page_embeds_its_outputs_and_widget_state(site):
    out, _, source = site
    notebooks = source / "notebooks"
    for path in sorted([*notebooks.glob("*.ipynb"), *notebooks.glob("solutions/*.ipynb")]):
        notebook = nbformat.read(path, as_version=4)
        name = path.relative_to(notebooks).as_posix()
        root = "../" * name.count("/")
        page = (out / name.replace(".ipynb", ".html")).read_text()
        assert f'<a href="{root}index.html">' in page  # the navigation back to the index
        images = sum("image/png" in output.get("data", {}) for cell in notebook.cells
                     if cell.cell_type == "code" for output in cell.outputs)
        assert page.count("data:image/png;base64,") >= images, path.name
        state = notebook.metadata.get("widgets", {}).get(build_site.WIDGET_STATE)
        if state is None:
            assert STATE_SCRIPT not in page, path.name
            continue
        assert page.count(STATE_SCRIPT) == 1 and VIEW_SCRIPT in page, path.name
        assert f'widgetRendererSrc = \'{root}_static/widgets/embed-amd.js\'' in page
        assert f'<script src="{root}_static/widgets/require.js">' in page
        stored = page.split(STATE_SCRIPT, 1)[1].split("</script>", 1)[0]
        assert json.loads(stored.replace("<\\/", "</")) == state, path.name
    assert (out / "_static" / "widgets" / "embed-amd.js").read_text() == "/* stand-in */"


README = """# demo

## The notebooks

| what it proves | notebook | time |
|---|---|---|
| that $\\|x\\| \\le 2$ holds | [`02_b.ipynb`](notebooks/02_b.ipynb) | ~2 s |
| the first thing | `01_a.ipynb` | ~1 s |

## Next section
"""


def _notebook(folder: Path, name: str, widgets: bool) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell(f"# Title of {name}"),
                      nbformat.v4.new_code_cell("1 + 1")]
    if widgets:
        notebook.metadata["widgets"] = {build_site.WIDGET_STATE: {
            "version_major": 2, "version_minor": 0, "state": {}}}
    nbformat.write(notebook, folder / name)


def test_the_table_parser_finds_columns_by_header_and_links():
    table = build_site.parse_notebook_table(README)
    assert table.time_header == "time"
    assert table.entries == [build_site.Entry("02_b.ipynb", "that $|x| \\le 2$ holds", "~2 s"),
                             build_site.Entry("01_a.ipynb", "the first thing", "~1 s")]
    with pytest.raises(ValueError, match="no '## The notebooks' section"):
        build_site.parse_notebook_table("# demo\n")
    with pytest.raises(ValueError, match="no column whose header contains 'time'"):
        build_site.parse_notebook_table(README.replace("| time |", "| minutes |"))


def test_unlisted_notebooks_are_placed_by_name_and_missing_ones_left_out(tmp_path):
    for name in ("00_z.ipynb", "01_a.ipynb", "02_b.ipynb"):
        _notebook(tmp_path, name, widgets=False)
    table = build_site.parse_notebook_table(README)
    entries, warnings = build_site.order_entries(table.entries, tmp_path)
    assert [entry.notebook for entry in entries] == ["00_z.ipynb", "02_b.ipynb", "01_a.ipynb"]
    assert warnings == ["warning: 00_z.ipynb is not in README.md's notebook table; published "
                        "without its description and run time"]
    (tmp_path / "01_a.ipynb").unlink()  # listed, not written yet: left out, with a warning
    entries, warnings = build_site.order_entries(table.entries, tmp_path)
    assert [entry.notebook for entry in entries] == ["00_z.ipynb", "02_b.ipynb"]
    assert warnings[0] == (f"warning: 01_a.ipynb is in README.md's notebook table but not in "
                           f"{tmp_path}; not published, links to it left as text")
    twice = build_site.Table("time", [*table.entries, table.entries[0]])
    with pytest.raises(ValueError, match=r"lists notebooks twice: \['02_b.ipynb'\]"):
        build_site.order_entries(twice.entries, tmp_path)


def test_cdn_mode_and_a_bad_widgets_folder(tmp_path, capsys):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    _notebook(notebooks, "01_a.ipynb", widgets=False)
    _notebook(notebooks, "02_b.ipynb", widgets=True)
    (tmp_path / "README.md").write_text(README)
    out = tmp_path / "site"
    assert build_site.main(["--out", str(out), "--notebooks", str(notebooks),
                            "--readme", str(tmp_path / "README.md"), "--widgets", "cdn",
                            "--mathjax", "cdn"]) == 0
    assert "2 notebooks ->" in capsys.readouterr().out
    index = (out / "index.html").read_text()
    assert re.findall(r'<a href="(\d\d[a-z]?_\w+\.html)">', index) == ["02_b.html", "01_a.html"]
    assert "Title of 02_b.ipynb" in index and "~2 s" in index
    page = (out / "02_b.html").read_text()
    assert STATE_SCRIPT in page and "https://unpkg.com/@jupyter-widgets/html-manager@" in page
    assert f'<script src="{build_site.MATHJAX_CDN}">' in page
    assert STATE_SCRIPT not in (out / "01_a.html").read_text()
    assert not (out / "_static").exists()
    assert build_site.main(["--out", str(out), "--notebooks", str(notebooks), "--readme",
                            str(tmp_path / "README.md"), "--widgets", str(tmp_path)]) == 1
    assert "not a folder holding embed-amd.js, require.js" in capsys.readouterr().err


def test_auto_falls_back_to_the_cdn_without_npm_and_npm_mode_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(build_site.shutil, "which", lambda name: None)
    folder, note = build_site.resolve_widgets("auto", cache=tmp_path / "vendor")
    assert folder is None and "unpkg.com" in note and "npm is not installed" in note
    with pytest.raises(RuntimeError, match="npm is not installed"):
        build_site.resolve_widgets("npm", cache=tmp_path / "vendor")
    (tmp_path / "vendor").mkdir()
    for name in build_site.VENDOR_FILES:  # a filled cache is used as it is, without npm
        (tmp_path / "vendor" / name).write_text("/* cached */")
    folder, note = build_site.resolve_widgets("auto", cache=tmp_path / "vendor")
    assert folder == tmp_path / "vendor" and "works offline" in note
    folder, note = build_site.resolve_mathjax("auto", cache=tmp_path / "mathjax")
    assert folder is None and "cdn.jsdelivr.net" in note and "npm is not installed" in note
    with pytest.raises(RuntimeError, match="npm is not installed"):
        build_site.resolve_mathjax("npm", cache=tmp_path / "mathjax")
    with pytest.raises(ValueError, match="--mathjax .*: not a folder holding tex-chtml-full.js"):
        build_site.resolve_mathjax(str(tmp_path / "vendor"))


# ------------------------------------------------------------- links, contents, text, MathJax


def test_every_link_of_the_site_stays_in_it_and_resolves(site):
    out, _, _ = site
    assert len(html_files(out)) > 1 + 7
    assert broken_links(out) == []
    assert broken_anchors(out) == []  # page#heading links name a heading of that page


def test_the_link_walk_fails_on_what_leaves_the_site_or_is_missing(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.html").write_text("<p id='here'>")
    (tmp_path / "sub" / "b.html").write_text(
        '<a href="../a.html#here">ok</a><a href="#top">ok</a><img src="data:image/png;base64,">'
        '<a href="https://example.org/x">ok</a><a href="mailto:a@b.c">ok</a>'
        '<a href="../../outside.html">escapes</a><a href="../missing.html#x">missing</a>'
        '<script src="/abs.js"></script><a href="file:///etc/passwd">scheme</a>'
        '<a href="../a.html#nowhere">anchor</a>')
    assert broken_links(tmp_path) == [
        "sub/b.html: a.href='../../outside.html' (leaves the site's folder)",
        "sub/b.html: a.href='../missing.html#x' (no such file in the site)",
        "sub/b.html: script.src='/abs.js' (absolute path (leaves the site once published))",
        "sub/b.html: a.href='file:///etc/passwd' (a scheme other than http(s), mailto and "
        "data)"]
    assert broken_anchors(tmp_path) == [
        "sub/b.html: '#top' (no id 'top' in sub/b.html)",
        "sub/b.html: '../a.html#nowhere' (no id 'nowhere' in a.html)"]


def test_solutions_are_pages_linked_from_their_notebooks(site):
    out, _, source = site
    listing = json.loads((out / "pages.json").read_text())
    solutions = sorted((source / "notebooks" / "solutions").glob("*.ipynb"))
    assert solutions
    for path in solutions:
        page = out / "solutions" / path.name.replace(".ipynb", ".html")
        title = build_site.notebook_title(nbformat.read(path, as_version=4), path.name)
        assert f"<title>{html.escape(title)}</title>" in page.read_text(), path.name
        notebook = path.name.replace("_solutions.ipynb", ".html")
        link = f'href="solutions/{page.name}"'
        assert link in (out / notebook).read_text(), notebook
        assert link in (out / "index.html").read_text(), notebook
        assert f'href="../{notebook}#Exercises"' in page.read_text(), page.name
        twin = (f"zh/solutions/{page.name}"
                if (source / "notebooks" / "zh" / "solutions" / path.name.replace(
                    ".ipynb", ".zh.ipynb")).exists() else None)
        assert {"notebook": f"solutions/{path.name}", "page": f"solutions/{page.name}",
                "title": title, "widgets": False, "run_time": None,
                "solutions": None, "twin": twin} in listing
    for page in html_files(out):  # no link to a notebook file is left
        assert not re.search(r'href="[^"]*\.ipynb', page.read_text()), page


def test_the_chinese_edition_is_published_and_each_page_links_its_twin(site):
    out, _, source = site
    listing = json.loads((out / "pages.json").read_text())
    twins = sorted((source / "notebooks" / "zh").glob("*.ipynb")) + sorted(
        (source / "notebooks" / "zh" / "solutions").glob("*.ipynb"))
    assert twins
    english_pages = {entry["page"]: entry for entry in listing if "twin" in entry}
    for path in twins:
        relative = path.relative_to(source / "notebooks" / "zh").as_posix()
        page = relative.replace(".zh.ipynb", ".html")  # a twin's page has the English name
        twin_page = out / "zh" / page
        text = twin_page.read_text()
        assert text.startswith("<!DOCTYPE html>") and '<html lang="zh-CN">' in text, page
        up = "../" * (page.count("/") + 1)
        assert f'href="{up}{page}">English</a>' in text, page  # the twin links the English page
        assert english_pages[page]["twin"] == f"zh/{page}"  # and the English page links it
        assert f'href="{"../" * page.count("/")}zh/{page}">中文版</a>' in (out / page).read_text()
        if "/" not in page:
            assert f'href="zh/{page}"' in (out / "index.html").read_text(), page
    index = (out / "index.html").read_text()
    assert '<h2 id="zh" lang="zh-CN">中文版</h2>' in index and 'href="zh/readme.html"' in index
    readme = (out / "zh" / "readme.html").read_text()
    assert '<html lang="zh-CN">' in readme and "两条命令" in readme
    assert "Noto Sans CJK SC" in readme  # a CJK font named in the font stack
    assert (out / "zh" / "docs" / "glossary.html").exists()


def test_links_to_files_outside_the_notebooks_go_to_copies_in_the_site(site):
    out, _, _ = site
    page = (out / "05_ddp_torchrun.html").read_text()
    assert 'href="source/gradaccum_course/programs/memory_probe.py.html"' in page
    assert 'href="source/benchmarks/deepspeed_cpu.txt.html"' in (out / "06_beyond.html").read_text()
    for page in html_files(out):
        assert 'href="../' not in page.read_text() or page.parent != out, page
    copy = (out / "source" / "gradaccum_course" / "programs" / "memory_probe.py.html").read_text()
    text = (ROOT / "gradaccum_course" / "programs" / "memory_probe.py").read_text()
    shown = html.unescape(copy.split('<pre id="source"><code>', 1)[1].split("</code></pre>")[0])
    assert shown == build_site.site_pages.as_text(text)
    assert 'href="../../../05_ddp_torchrun.html"' in copy  # back to the page that links it


def test_each_page_has_contents_linking_its_headings(site):
    out, _, source = site
    for path in sorted((source / "notebooks").glob("*.ipynb")):
        page = (out / path.name.replace(".ipynb", ".html")).read_text()
        main = page.split("<main>", 1)[1]
        contents = main.split('<nav class="gradaccum-toc"', 1)[1].split("</nav>", 1)[0]
        headings = re.findall(r'<h[23] id="([^"]+)"', main)
        assert len(headings) >= 3, path.name
        assert re.findall(r'<a href="#([^"]+)"', contents) == headings, path.name
    contents = (out / "02_single_device.html").read_text().split("gradaccum-toc", 1)[1]
    assert '<a href="#4.-Explore:-$k$-and-the-micro-batch-size">4. Explore: $k$ and' in contents


def test_formulas_are_left_to_the_local_mathjax_on_every_page(site):
    out, _, _ = site
    assert (out / "_static" / "mathjax" / "tex-chtml-full.js").read_text() == "/* stand-in */"
    for page in html_files(out):
        text = page.read_text()
        if page.is_relative_to(out / "source"):
            assert "<script" not in text.lower(), page  # a copy of a file: no TeX to typeset
            continue
        root = "../" * (len(page.relative_to(out).parts) - 1)
        assert f'<script src="{root}_static/mathjax/tex-chtml-full.js">' in text, page
        assert "inlineMath: [['$', '$']" in text and "displayMath: [['$$', '$$']" in text
        assert "cdnjs.cloudflare.com/ajax/libs/mathjax" not in text, page
        assert "MathJax.Hub.Config" not in text, page  # nbconvert's MathJax 2 block is gone
    heading = re.search(r'<h2 id="4.-Explore[^>]*>(.*?)<a', (out / "02_single_device.html")
                        .read_text()).group(1)
    assert heading == "4. Explore: $k$ and the micro-batch size"  # the TeX MathJax typesets
    assert "$\\nabla L = \\sum_j \\frac{n_j}{N}\\nabla L_j$" in (out / "index.html").read_text()


def test_the_index_points_to_nothing_it_does_not_hold_and_emoji_are_words(site):
    out, _, _ = site
    index = html.unescape(re.sub(r"<[^>]+>", "", (out / "index.html").read_text()))
    assert "below" not in index and "above" not in index
    assert "the article's claims one by one" in index  # 09's row of the README's table
    for page in html_files(out):
        assert not re.search("[\U0001F000-\U0001FAFF]", page.read_text()), page
    assert "the 2024 Hugging Face transformers" in index
    assert "The 2024 Hugging Face transformers fix" in (out / "03_tokens_and_padding.html") \
        .read_text()


def _linking_notebook(folder: Path, name: str, link: str) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell(f"# Title of {name}\n\n## Part\n\n"
                                                    f"See [the code]({link}).")]
    nbformat.write(notebook, folder / name)


def test_links_to_the_repository_and_to_solutions_in_a_small_series(tmp_path):
    (tmp_path / "notebooks" / "solutions").mkdir(parents=True)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("print('<a>')\n")
    (tmp_path / "README.md").write_text(README)
    _linking_notebook(tmp_path / "notebooks", "01_a.ipynb", "../src/a.py#L1")
    _linking_notebook(tmp_path / "notebooks", "02_b.ipynb", "solutions/02_b_solutions.ipynb")
    _linking_notebook(tmp_path / "notebooks" / "solutions", "02_b_solutions.ipynb",
                      "../../src/a.py")
    out = tmp_path / "site"

    def build() -> list[Path]:
        return build_site.build(out, notebooks=tmp_path / "notebooks",
                                readme=tmp_path / "README.md", widgets="cdn", mathjax="cdn",
                                repo=tmp_path)

    pages = build()
    assert [page.relative_to(out).as_posix() for page in pages] == [
        "index.html", "02_b.html", "01_a.html", "solutions/02_b_solutions.html", "readme.html",
        "source/src/a.py.html"]
    assert 'href="source/src/a.py.html#L1"' in (out / "01_a.html").read_text()
    assert 'href="../source/src/a.py.html"' in (out / "solutions/02_b_solutions.html").read_text()
    assert "print(&#x27;&lt;a&gt;&#x27;)" in (out / "source/src/a.py.html").read_text()
    assert broken_links(out) == []
    _linking_notebook(tmp_path / "notebooks", "01_a.ipynb", "../src/gone.py")
    with pytest.raises(ValueError, match="01_a.html links src/gone.py, which is not a file"):
        build()
    _linking_notebook(tmp_path / "notebooks", "01_a.ipynb", "../../elsewhere.py")
    with pytest.raises(ValueError, match="01_a.html: the link '../../elsewhere.py' leaves"):
        build()


# ------------------------------------------------------------ the README and the docs/ pages


def test_every_docs_page_is_rendered_and_linked_from_the_index_and_the_readme(site):
    out, _, source = site
    names = sorted(path.stem for path in (source / "docs").glob("*.md"))
    assert names, "no docs/*.md page"
    index = (out / "index.html").read_text()
    docs_table = index.split('<table id="docs">', 1)[1].split("</table>", 1)[0]
    linked = re.findall(r'<td><a href="([^"]+)">', docs_table)
    assert linked[0] == "readme.html"
    assert sorted(linked[1:]) == [f"docs/{name}.html" for name in names]
    readme = (source / "README.md").read_text()
    listing = json.loads((out / "pages.json").read_text())
    for name in names:
        text = (source / "docs" / f"{name}.md").read_text()
        title = build_site.site_pages.markdown_title(text, name)
        page = (out / "docs" / f"{name}.html").read_text()
        assert f"<title>{html.escape(title)}</title>" in page, name
        assert '<a href="../index.html">' in page and '<a href="../readme.html">' in page, name
        assert f"](docs/{name}.md" in readme, f"the README does not link docs/{name}.md"
        assert text.startswith(f"# {title}\n\n"), f"{name}.md: a title, then its point"
        point = build_site.site_pages.markdown_point(text)
        assert len(point) > 100, f"{name}.md starts with a one-paragraph point"
        assert {"markdown": f"docs/{name}.md", "page": f"docs/{name}.html", "title": title,
                "widgets": False} in listing
    # the README's own order of its documentation list, taken by the index
    section = readme.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    assert linked[1:] == [link.replace(".md", ".html")
                          for link in re.findall(r"\]\((docs/[^)#]+\.md)", section)]
    assert (out / "readme.html").is_file()


def test_links_between_the_readme_the_docs_and_the_notebooks_stay_in_the_site(site):
    out, _, _ = site
    readme = (out / "readme.html").read_text()
    assert 'href="docs/running.html#what-make-lab-does"' in readme  # README -> docs, heading
    assert 'href="00_the_article.html"' in readme  # README -> notebook
    training = (out / "docs" / "training.html").read_text()
    assert 'href="../04_emr_case_study.html"' in training  # docs -> notebook
    assert 'href="security.html"' in training  # docs -> docs
    assert 'href="../source/tests/test_train.py.html"' in training  # docs -> a source copy
    assert 'id="the-three-commands"' in training  # headings named as GitHub names them
    for page in [out / "readme.html", *sorted((out / "docs").glob("*.html"))]:
        assert not re.search(r'href="[^"]*\.(?:md|ipynb)(?:#[^"]*)?"', page.read_text()), page
    # the link walk of test_every_link_of_the_site_stays_in_it_and_resolves covers these pages
    # and their #anchors too


def test_markdown_tables_and_fenced_code_render(site):
    out, _, _ = site
    commands = (out / "docs" / "commands.html").read_text()
    assert "<table>" in commands and "<th>command</th>" in commands
    assert "<td><code>make site</code></td>" in commands
    training = (out / "docs" / "training.html").read_text()
    blocks = re.findall(r'<div class="highlight"><pre>(.*?)</pre></div>', training, re.DOTALL)
    assert len(blocks) == 2
    assert "recipes.emr_classification.train" in re.sub(r"<[^>]+>", "", blocks[0])
    assert "```" not in training
    readme = (out / "readme.html").read_text()
    assert readme.count("<table>") == 2  # the notebook map and the article's claims
    assert "$\\nabla L = \\sum_j \\frac{n_j}{N}\\nabla L_j$" in readme  # left to MathJax


def test_markdown_pages_in_a_small_series(tmp_path, capsys):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "docs").mkdir()
    _notebook(tmp_path / "notebooks", "01_a.ipynb", widgets=False)
    _notebook(tmp_path / "notebooks", "02_b.ipynb", widgets=False)
    (tmp_path / "src.py").write_text("x = 1\n")
    readme = README.replace(
        "| ~1 s |\n", "| ~1 s |\n| not yet | [`03_c.ipynb`](notebooks/03_c.ipynb) | ~5 s |\n"
    ) + "\n## Documentation\n\n- [Two](docs/two.md)\n- [One](docs/one.md#the-part-here-1)\n"
    (tmp_path / "README.md").write_text(readme)
    (tmp_path / "docs" / "one.md").write_text(
        "# Page one\n\nIts point, with [a notebook](../notebooks/01_a.ipynb).\n\n"
        "## The `part`: here\n\nSee [two](two.md#a-table), [the code](../src.py) and "
        "[the coming notebook](../notebooks/03_c.ipynb) and [its solutions]"
        "(../notebooks/solutions/01_a_solutions.ipynb).\n\n## The `part`: here\n")
    (tmp_path / "docs" / "two.md").write_text(
        "# Page two\n\nIts point.\n\n## A table\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        "```python\nprint(1)\n```\n\n[Back](../README.md)\n")
    out = tmp_path / "site"
    pages = build_site.build(out, notebooks=tmp_path / "notebooks",
                             readme=tmp_path / "README.md", widgets="cdn", mathjax="cdn",
                             repo=tmp_path)
    assert [page.relative_to(out).as_posix() for page in pages] == [
        "index.html", "02_b.html", "01_a.html", "readme.html", "docs/two.html",
        "docs/one.html", "source/src.py.html"]
    one = (out / "docs" / "one.html").read_text()
    assert 'href="../01_a.html"' in one and 'href="two.html#a-table"' in one
    assert 'href="../source/src.py.html"' in one
    assert ('<span class="pending" title="not published yet">the coming notebook</span>'
            in one)  # listed in the README's table, not written yet
    assert '<span class="pending" title="not published yet">its solutions</span>' in one
    assert 'id="the-part-here"' in one and 'id="the-part-here-1"' in one  # GitHub's names
    two = (out / "docs" / "two.html").read_text()
    assert "<td>1</td>" in two and '<div class="highlight"><pre>' in two
    assert 'href="../readme.html"' in two
    index = (out / "index.html").read_text()
    assert re.findall(r'<td><a href="([^"]+)">', index.split('id="docs"')[1]) == [
        "readme.html", "docs/two.html", "docs/one.html"]
    assert 'Its point, with <a href="01_a.html">a notebook</a>.' in index
    assert "03_c" not in index.split('id="docs"')[0]  # no row for a notebook not yet written
    assert broken_links(out) == [] and broken_anchors(out) == []
    assert ("warning: notebooks/solutions/01_a_solutions.ipynb is not written yet: named as "
            "text, unlinked, in docs/one.html") in capsys.readouterr().out
    (tmp_path / "docs" / "two.md").write_text("# Page two\n\n[Gone](gone.md)\n")
    with pytest.raises(ValueError, match="docs/two.html links docs/gone.md, which is not a"):
        build_site.build(out, notebooks=tmp_path / "notebooks", readme=tmp_path / "README.md",
                         widgets="cdn", mathjax="cdn", repo=tmp_path)


def test_an_image_a_page_shows_is_copied_into_the_site(site):
    """docs/conformance.md and its Chinese page embed the heat-map: the site holds a copy, and
    each page's <img> reaches it."""
    from urllib.parse import unquote

    out, _, _ = site
    for page in (out / "docs" / "conformance.html", out / "zh" / "docs" / "conformance.html"):
        sources = re.findall(r'<img\s[^>]*?\bsrc="([^"]+)"', page.read_text())
        assert sources, f"{page.name}: no image"
        for source in sources:
            image = (page.parent / unquote(html.unescape(source))).resolve()
            assert image.is_file() and image.is_relative_to(out.resolve()), (page, source)
            assert image.read_bytes() == (ROOT / "docs" / "conformance" / "conformance.png"
                                          ).read_bytes()
