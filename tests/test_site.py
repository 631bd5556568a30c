"""scripts/build_site.py (`make site`): the static HTML edition and its index.

The real series (a read-only snapshot of notebooks/ and README.md) is built once into a
temporary folder (about 10 s), with a stand-in folder of widget files so that no network is
needed; small synthetic inputs cover the parser and the CDN mode.
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

ROOT = Path(__file__).resolve().parent.parent
build_site = load_script("scripts/build_site.py")

STATE_SCRIPT = '<script type="application/vnd.jupyter.widget-state+json">'
VIEW_SCRIPT = '<script type="application/vnd.jupyter.widget-view+json">'


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    # a read-only snapshot of the notebooks and README: building must not write them, and
    # edits made meanwhile cannot mix two versions
    source = tmp_path_factory.mktemp("source")
    (source / "notebooks").mkdir()
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        shutil.copy(path, source / "notebooks" / path.name)
    shutil.copy(ROOT / "README.md", source / "README.md")
    for path in [*(source / "notebooks").iterdir(), source / "README.md"]:
        path.chmod(0o444)
    vendor = tmp_path_factory.mktemp("vendor")
    (vendor / "embed-amd.js").write_text("/* stand-in */")
    (vendor / "require.js").write_text("/* stand-in */")
    out = tmp_path_factory.mktemp("site")
    pages = build_site.build(out, notebooks=source / "notebooks", readme=source / "README.md",
                             widgets=str(vendor))
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
    listed = [entry.notebook for entry in table.entries]
    assert [name for name in order if name in listed] == listed  # the README's order
    links = re.findall(r'<a href="(\d\d_[a-z0-9_]+\.html)">', index)
    assert links == [name.removesuffix(".ipynb") + ".html" for name in order]
    assert [page.name for page in pages] == ["index.html", *links]
    for link in links:
        assert (out / link).is_file()
    # each row carries the README's run time and what the notebook proves
    rows = index.split("<tr>")[2:]
    by_link = {re.search(r'href="([^"]+)"', row).group(1): row for row in rows}
    for entry in table.entries:
        row = by_link[entry.notebook.removesuffix(".ipynb") + ".html"]
        assert f"<td class='time'>{html.escape(entry.run_time)}</td>" in row
        words = re.sub(r"[`$\\{}]", "", entry.proves).split()[-4:]
        assert " ".join(words) in html.unescape(re.sub(r"<[^>]+>", "", row)), entry.notebook


def test_each_page_embeds_its_outputs_and_widget_state(site):
    out, _, source = site
    for path in sorted((source / "notebooks").glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        page = (out / path.name.replace(".ipynb", ".html")).read_text()
        assert '<a href="index.html">' in page  # the navigation back to the index
        images = sum("image/png" in output.get("data", {}) for cell in notebook.cells
                     if cell.cell_type == "code" for output in cell.outputs)
        assert page.count("data:image/png;base64,") >= images, path.name
        state = notebook.metadata.get("widgets", {}).get(build_site.WIDGET_STATE)
        if state is None:
            assert STATE_SCRIPT not in page, path.name
            continue
        assert page.count(STATE_SCRIPT) == 1 and VIEW_SCRIPT in page, path.name
        assert 'widgetRendererSrc = \'_static/widgets/embed-amd.js\'' in page
        assert '<script src="_static/widgets/require.js">' in page
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


def test_unlisted_notebooks_are_placed_by_name_and_missing_ones_refused(tmp_path):
    for name in ("00_z.ipynb", "01_a.ipynb", "02_b.ipynb"):
        _notebook(tmp_path, name, widgets=False)
    table = build_site.parse_notebook_table(README)
    entries, warnings = build_site.order_entries(table.entries, tmp_path)
    assert [entry.notebook for entry in entries] == ["00_z.ipynb", "02_b.ipynb", "01_a.ipynb"]
    assert warnings == ["warning: 00_z.ipynb is not in README.md's notebook table; published "
                        "without its description and run time"]
    (tmp_path / "01_a.ipynb").unlink()
    with pytest.raises(ValueError, match=r"listed but not in .*\['01_a.ipynb'\]"):
        build_site.order_entries(table.entries, tmp_path)


def test_cdn_mode_and_a_bad_widgets_folder(tmp_path, capsys):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    _notebook(notebooks, "01_a.ipynb", widgets=False)
    _notebook(notebooks, "02_b.ipynb", widgets=True)
    (tmp_path / "README.md").write_text(README)
    out = tmp_path / "site"
    assert build_site.main(["--out", str(out), "--notebooks", str(notebooks),
                            "--readme", str(tmp_path / "README.md"), "--widgets", "cdn"]) == 0
    assert "2 notebooks ->" in capsys.readouterr().out
    index = (out / "index.html").read_text()
    assert re.findall(r'<a href="(\d\d_\w+\.html)">', index) == ["02_b.html", "01_a.html"]
    assert "Title of 02_b.ipynb" in index and "~2 s" in index
    page = (out / "02_b.html").read_text()
    assert STATE_SCRIPT in page and "https://unpkg.com/@jupyter-widgets/html-manager@" in page
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
