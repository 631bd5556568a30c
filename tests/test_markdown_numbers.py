"""Numbers with units in the notebooks' prose are backed by an output, or cited with a source.

Every number followed by a unit (%, GiB, GB, TB, MiB, MB, ms, s, a ×/x factor, M/B parameters)
in a markdown cell must appear, with the same unit, in some output of the same notebook, or
be listed in CITED with the source it comes from. Links between notebooks must point at a
heading that exists (JupyterLab's anchors: the heading's text, spaces replaced by '-').
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# a number (1,234 / 0.5 / 1e-12 is not one: no unit follows) and its unit
UNITS = r"%|GiB|GB|TB|MiB|MB|KiB|ms|µs|s|×|x|M|B"
NUMBER_WITH_UNIT = re.compile(
    rf"(?<![\w.,^{{])(\d[\d,]*(?:\.\d+)?)(\s?)({UNITS})(?![\w])"
)
UNIT_ALIASES = {"×": "[×x]", "x": "[×x]"}

#: numbers stated in prose that no output prints: (notebook, "number unit") -> source
CITED: dict[tuple[str, str], str] = {
    # the spoken answer says two of the card's figures that 09 computes (test_answer_card)
    ("00_the_article.ipynb", "1.30 GB"): "09's card cells: DDP's bucket copy of the gradients",
    ("00_the_article.ipynb", "59%"): "09's card cells: mean / k on an uneven DDP window",
    ("02_single_device.ipynb", "10%"): "a tolerance: 02 §1 asserts activation_error <= 0.10",
    ("03_tokens_and_padding.ipynb", "15%"):
        "BERT's masking rate: Devlin et al. 2019, arXiv:1810.04805, §3.1",
    ("04_emr_case_study.ipynb", "16 GB"): "the V100's memory (NVIDIA V100 datasheet, 16 GB model)",
    ("04_emr_case_study.ipynb", "1 GiB"): "a planning input: reserve = 1 * GIB in 04 §3's code",
    ("04_emr_case_study.ipynb", "175B"): "the article's figure for RoBERTa-wwm-large (notebook 09)",
    ("06_beyond.ipynb", "40%"):
        "the article's figure (GPU utilisation under 40%), quoted in 06 §5 (notebook 09 §6)",
    ("06_beyond.ipynb", "15%"): "a tolerance: 06 §1 asserts abs(estimate - truth) <= 0.15 * truth",
}
# each notebook's header states its run time, recorded in scripts/run_times.json by
# scripts/execute_notebooks.py (tests/test_run_times.py checks header, README and record agree)
CITED.update({
    (name, f"{max(5, 5 * math.ceil(seconds / 5))} s"): "run time, scripts/run_times.json"
    for name, seconds in json.loads(
        (ROOT / "scripts" / "run_times.json").read_text())["seconds"].items()
    if "/" not in name
})


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _outputs_text(cells: list[dict]) -> str:
    texts = []
    for cell in cells:
        for output in cell.get("outputs", []):
            if "text" in output:
                texts.append("".join(output["text"]))
            for kind in ("text/plain", "text/markdown", "text/html"):
                if kind in output.get("data", {}):
                    texts.append("".join(output["data"][kind]))
    return "\n".join(texts)


def _prose(cell: dict) -> str:
    """A markdown cell's text without code spans, math and link targets."""
    text = "".join(cell["source"])
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", " ", text, flags=re.S)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets (anchors hold heading words)
    return re.sub(r"arXiv:\S+|#\d+", " ", text)  # paper ids and issue numbers


def numbers_in(prose: str) -> list[str]:
    """Return the 'number unit' strings in prose ("32 × 8" multiplies; "2.1×" is a factor)."""
    return [f"{number}{space}{unit}"
            for number, space, unit in NUMBER_WITH_UNIT.findall(prose)
            if not (space and unit in "×x")]


def markdown_numbers(path: Path) -> list[str]:
    """Return the 'number unit' strings in the notebook's markdown cells."""
    return [token for cell in _cells(path) if cell["cell_type"] == "markdown"
            for token in numbers_in(_prose(cell))]


def is_backed(token: str, outputs: str) -> bool:
    """True when an output prints the number with the same unit (× and x are the same)."""
    number, unit = NUMBER_WITH_UNIT.fullmatch(token).group(1, 3)
    pattern = rf"(?<![\d.]){re.escape(number)}\s?{UNIT_ALIASES.get(unit, re.escape(unit))}(?!\w)"
    return re.search(pattern, outputs) is not None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_numbers_in_markdown_are_printed_or_cited(path):
    outputs = _outputs_text(_cells(path))
    unbacked = sorted({token for token in markdown_numbers(path)
                       if not is_backed(token, outputs) and (path.name, token) not in CITED})
    assert not unbacked, f"{path.name}: numbers no output prints and CITED lacks: {unbacked}"


def test_every_cited_number_is_still_in_its_notebook():
    for (name, token), source in CITED.items():
        assert source, (name, token)
        assert token in markdown_numbers(ROOT / "notebooks" / name), (name, token)


def _anchors(path: Path) -> set[str]:
    anchors = set()
    for cell in _cells(path):
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                heading = re.match(r"#{1,6}\s+(.*)", line)
                if heading:
                    text = re.sub(r"`([^`]*)`", r"\1", heading.group(1).strip())
                    anchors.add(re.sub(r"\*\*|__", "", text).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_links_between_notebooks_point_at_headings(path):
    for cell in _cells(path):
        if cell["cell_type"] != "markdown":
            continue
        links = re.findall(r"\]\(([\w.]*\.ipynb)?#([^)]+)\)", "".join(cell["source"]))
        for target, anchor in links:
            linked = path.parent / target if target else path
            assert linked.exists(), f"{path.name}: link to a missing notebook {target}"
            assert anchor in _anchors(linked), f"{path.name}: no heading #{anchor} in {linked.name}"


def test_the_scanner_finds_and_matches_units():
    cell = {"cell_type": "markdown",
            "source": ["2.1× the time, 60% of a step, 1.2 GiB, 325.5M and 175B parameters, 10 s, ",
                       "32 × 8; not `3 GB` in code, not $4 MiB$ in math, not arXiv:2004.13922"]}
    assert numbers_in(_prose(cell)) == ["2.1×", "60%", "1.2 GiB", "325.5M", "175B", "10 s"]
    assert is_backed("2.1×", "2.1x faster") and not is_backed("2.1×", "12.1x faster")
    assert is_backed("1.2 GiB", "gradient 1.2GiB") and not is_backed("1.2 GiB", "1.21 GiB")
