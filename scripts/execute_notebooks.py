"""Re-execute notebooks in place, top to bottom, storing outputs and widget state.

Usage: python scripts/execute_notebooks.py notebooks/*.ipynb  (the Makefile's `notebooks`)
       python scripts/execute_notebooks.py --check notebooks/*.ipynb  (`make check-profiles`:
       execute under the current profile, write and record nothing, report every failure)
       python scripts/execute_notebooks.py --no-record notebooks/04_*.ipynb  (store outputs,
       record no run time: on a busy machine, or for a notebook not yet in the README's table)

The series' run times have one source: each execution of a notebook of the series (in
``notebooks/`` or ``notebooks/solutions/``) records its wall time in
``scripts/run_times.json`` and writes the rounded figure into the notebook's header line
("Run time on N CPU cores (`ci` profile): about T s.") and into the README's notebook table.
``tests/test_run_times.py`` checks that the three agree.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
RUN_TIMES = ROOT / "scripts" / "run_times.json"
README = ROOT / "README.md"
HEADER = re.compile(r"Run time on \d+ CPU cores? \(`ci` profile\): [^.\n]*\.")


def about(seconds: float) -> int:
    """Return a run time rounded up to a multiple of 5 s (at least 5 s)."""
    return max(5, 5 * math.ceil(seconds / 5))


def header_line(seconds: float, cores: int) -> str:
    """Return the header sentence a notebook states its run time in."""
    return f"Run time on {cores} CPU cores (`ci` profile): about {about(seconds)} s."


def readme_time(seconds: float) -> str:
    """Return the README table's time cell for a run time."""
    return f"~{about(seconds)} s"


def execute(path: Path, timeout: int = 600, write: bool = True) -> float:
    """Execute the notebook at ``path`` in its own folder, write it back (unless ``write`` is
    False); return seconds."""
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
    if write:
        nbformat.write(notebook, path)
    return seconds


def _write_header(path: Path, seconds: float) -> None:
    notebook = nbformat.read(path, as_version=4)
    first, line = notebook.cells[0], header_line(seconds, os.cpu_count() or 1)
    if first.cell_type != "markdown" or not HEADER.search(first.source):
        raise ValueError(f"{path.name}: its first cell must state the run time as '{line}'")
    first.source = HEADER.sub(line, first.source)
    nbformat.write(notebook, path)


def record(path: Path, seconds: float) -> None:
    """Store ``seconds`` for a notebook of the series in run_times.json and the README."""
    seconds = round(seconds, 1)  # what run_times.json stores: header and README use the same
    resolved = path.resolve()
    if resolved.parent not in (NOTEBOOKS.resolve(), (NOTEBOOKS / "solutions").resolve()):
        return  # a notebook outside the series (e.g. a test's)
    profile = os.environ.get("GRADACCUM_PROFILE", "")
    if profile != "ci":
        print(f"  (not recorded: GRADACCUM_PROFILE={profile!r}, the committed outputs use 'ci')")
        return
    data = json.loads(RUN_TIMES.read_text()) if RUN_TIMES.is_file() else {}
    data.update(profile="ci", cpu_cores=os.cpu_count() or 1,
                threads=os.environ.get("OMP_NUM_THREADS", "unset"))
    key = resolved.relative_to(NOTEBOOKS.resolve()).as_posix()
    data.setdefault("seconds", {})[key] = seconds
    data["seconds"] = dict(sorted(data["seconds"].items()))
    RUN_TIMES.write_text(json.dumps(data, indent=1) + "\n")
    if resolved.parent == NOTEBOOKS.resolve():
        _write_header(path, seconds)
        readme = README.read_text(encoding="utf-8")
        row = re.compile(rf"^(\| \[`{re.escape(path.name)}`\].*\| )~\d+ s \|$", re.M)
        if not row.search(readme):
            raise ValueError(f"README.md's notebook table has no row for {path.name} ending in "
                             "a '~N s |' time cell")
        README.write_text(row.sub(lambda m: f"{m.group(1)}{readme_time(seconds)} |", readme),
                          encoding="utf-8")


def main(paths: list[str]) -> int:
    check, no_record = "--check" in paths, "--no-record" in paths
    paths = [name for name in paths if name not in ("--check", "--no-record")]
    if not paths:
        print("usage: execute_notebooks.py [--check | --no-record] NOTEBOOK.ipynb ...",
              file=sys.stderr)
        return 2
    for name in paths:
        path = Path(name)
        if path.suffix != ".ipynb" or not path.is_file():
            print(f"not a notebook file: {name}", file=sys.stderr)
            return 2
    failed = []
    for name in paths:
        path = Path(name)
        print(f"executing {path} ...", flush=True)
        if not check:
            seconds = execute(path)
            if not no_record:
                record(path, seconds)
            print(f"  done in {seconds:.1f} s{' (not recorded)' if no_record else ''}",
                  flush=True)
            continue
        try:
            seconds = execute(path, write=False)
            print(f"  ok in {seconds:.1f} s (nothing written)", flush=True)
        except Exception as error:  # noqa: BLE001 - report each notebook, then the list
            failed.append(path.name)
            last = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines()[-1]
            print(f"  FAILED: {last[:300]}", flush=True)
    if failed:
        print(f"{len(failed)} of {len(paths)} failed under GRADACCUM_PROFILE="
              f"{os.environ.get('GRADACCUM_PROFILE', '')}: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
