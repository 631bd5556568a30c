"""scripts/execute_notebooks.py: re-executes a notebook in place, rejects what is not one."""

from __future__ import annotations

import nbformat
from script_loader import load_script

execute_notebooks = load_script("scripts/execute_notebooks.py")


def test_execute_writes_outputs_and_counts_in_order(tmp_path):
    path = tmp_path / "00_tiny.ipynb"
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("x = 20"), nbformat.v4.new_code_cell("x + 22")]
    nbformat.write(notebook, path)
    assert execute_notebooks.main([str(path)]) == 0
    executed = nbformat.read(path, as_version=4)
    assert [cell.execution_count for cell in executed.cells] == [1, 2]
    assert executed.cells[1].outputs[0]["data"]["text/plain"] == "42"


def test_main_rejects_missing_and_non_notebook_paths(tmp_path, capsys):
    assert execute_notebooks.main([]) == 2
    assert execute_notebooks.main([str(tmp_path / "missing.ipynb")]) == 2
    assert "not a notebook file" in capsys.readouterr().err
