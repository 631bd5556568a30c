"""Re-execute notebooks in place, top to bottom, storing outputs and widget state.

Usage: python scripts/execute_notebooks.py notebooks/*.ipynb  (the Makefile's `notebooks`)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path: Path, timeout: int = 600) -> float:
    """Execute the notebook at ``path`` in its own folder, write it back; return seconds."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        store_widget_state=True,
    )
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    nbformat.write(notebook, path)
    return seconds


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: execute_notebooks.py NOTEBOOK.ipynb ...", file=sys.stderr)
        return 2
    for name in paths:
        path = Path(name)
        if path.suffix != ".ipynb" or not path.is_file():
            print(f"not a notebook file: {name}", file=sys.stderr)
            return 2
        print(f"executing {path} ...", flush=True)
        print(f"  done in {execute(path):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
