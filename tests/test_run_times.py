"""Run times have one source: scripts/run_times.json, written by scripts/execute_notebooks.py
when it executes a notebook; each notebook's header and the README's table state the same
rounded figure."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parent.parent
execute_notebooks = load_script("scripts/execute_notebooks.py")

NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*.ipynb"))


def _run_times() -> dict:
    return json.loads((ROOT / "scripts" / "run_times.json").read_text())


def test_run_times_were_measured_under_the_committed_profile() -> None:
    RUN_TIMES = _run_times()  # noqa: N806
    assert RUN_TIMES["profile"] == "ci"
    solutions = sorted(p.name for p in (ROOT / "notebooks" / "solutions").glob("*.ipynb"))
    assert set(RUN_TIMES["seconds"]) == {p.name for p in NOTEBOOKS} | {
        f"solutions/{name}" for name in solutions}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_header_and_readme_state_the_recorded_run_time(notebook: Path) -> None:
    RUN_TIMES = _run_times()  # noqa: N806
    seconds = RUN_TIMES["seconds"][notebook.name]
    header = nbformat.read(notebook, as_version=4).cells[0].source
    assert execute_notebooks.header_line(seconds, RUN_TIMES["cpu_cores"]) in header
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    row = re.search(rf"^\| \[`{re.escape(notebook.name)}`\].*\| (~\d+ s) \|$", readme, re.M)
    assert row, f"no README row for {notebook.name}"
    assert row.group(1) == execute_notebooks.readme_time(seconds)


def test_rounding() -> None:
    assert [execute_notebooks.about(s) for s in (0.4, 5.0, 5.1, 61.0)] == [5, 5, 10, 65]


def test_recording_rewrites_header_json_and_readme(tmp_path, monkeypatch) -> None:
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    path = notebooks / "07_new.ipynb"
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell(
        "# 07\n\nRun time on 2 CPU cores (`ci` profile): about 5 s.\n")]
    nbformat.write(notebook, path)
    readme = tmp_path / "README.md"
    readme.write_text("| [`07_new.ipynb`](notebooks/07_new.ipynb) | proves | ~5 s |\n")
    monkeypatch.setattr(execute_notebooks, "NOTEBOOKS", notebooks)
    monkeypatch.setattr(execute_notebooks, "RUN_TIMES", notebooks / "run_times.json")
    monkeypatch.setattr(execute_notebooks, "README", readme)
    monkeypatch.setattr(execute_notebooks.os, "cpu_count", lambda: 4)
    monkeypatch.setenv("GRADACCUM_PROFILE", "ci")
    execute_notebooks.record(path, 12.3)
    assert json.loads((notebooks / "run_times.json").read_text())["seconds"] == {
        "07_new.ipynb": 12.3}
    assert "Run time on 4 CPU cores (`ci` profile): about 15 s." in path.read_text()
    assert readme.read_text().endswith("| ~15 s |\n")
    execute_notebooks.record(path, 15.04)  # stored as 15.0: the header says 15 s, not 20 s
    assert json.loads((notebooks / "run_times.json").read_text())["seconds"] == {
        "07_new.ipynb": 15.0}
    assert "about 15 s." in path.read_text() and readme.read_text().endswith("| ~15 s |\n")
    monkeypatch.setenv("GRADACCUM_PROFILE", "cpu")  # other profiles are not recorded
    execute_notebooks.record(path, 99.0)
    assert "about 15 s" in path.read_text()


def test_a_notebook_without_the_header_line_is_refused(tmp_path, monkeypatch) -> None:
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    path = notebooks / "07_new.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 07")]), path)
    monkeypatch.setattr(execute_notebooks, "NOTEBOOKS", notebooks)
    monkeypatch.setattr(execute_notebooks, "RUN_TIMES", notebooks / "run_times.json")
    monkeypatch.setenv("GRADACCUM_PROFILE", "ci")
    with pytest.raises(ValueError, match="must state the run time"):
        execute_notebooks.record(path, 3.0)


def test_check_mode_executes_writes_nothing_and_reports_every_failure(tmp_path, capsys):
    import nbformat

    paths = []
    for name, code in (("fine", "x = 1 + 1"), ("broken", "assert False, 'a size claim'")):
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
        path = tmp_path / f"{name}.ipynb"
        nbformat.write(notebook, path)
        paths.append(path)
    before = [path.read_bytes() for path in paths]
    assert execute_notebooks.main(["--check", *map(str, paths)]) == 1
    out, err = capsys.readouterr()
    assert "ok in" in out and "FAILED: AssertionError: a size claim" in out
    assert "1 of 2 failed" in err and "broken.ipynb" in err
    assert [path.read_bytes() for path in paths] == before  # nothing written


def test_no_record_mode_stores_outputs_and_records_no_run_time(tmp_path, monkeypatch, capsys):
    import nbformat

    path = tmp_path / "plain.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")]),
                   path)
    recorded = []
    monkeypatch.setattr(execute_notebooks, "record", lambda *args: recorded.append(args))
    assert execute_notebooks.main(["--no-record", str(path)]) == 0
    assert recorded == []
    assert "42" in nbformat.read(path, as_version=4).cells[0].outputs[0]["text"]
    assert "(not recorded)" in capsys.readouterr().out
