"""The set-up files agree with each other, and the notebooks are committed executed."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)$")


def _pins(requirements: list[str], source: str) -> dict[str, str]:
    pins = {}
    for requirement in requirements:
        match = PIN.match(requirement.strip())
        assert match, f"{source}: {requirement!r} is not pinned exactly (name==version)"
        pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def _pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["dev"]
    return _pins(requirements, "pyproject.toml")


def _environment_pins() -> dict[str, str]:
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert environment["channels"] == ["conda-forge"]
    conda = [d for d in environment["dependencies"] if isinstance(d, str)]
    assert "python=3.11" in conda
    pip_section = next(d["pip"] for d in environment["dependencies"] if isinstance(d, dict))
    return _pins([r for r in pip_section if not r.startswith("-")], "environment.yml")


def test_environment_yml_pins_the_same_packages_as_pyproject():
    assert _environment_pins() == _pyproject_pins()


def test_torch_is_pinned_exactly_and_transformers_is_5x():
    pins = _pyproject_pins()
    assert pins["torch"] == "2.13.0"
    assert pins["transformers"].startswith("5.")
    assert pins["ipywidgets"].startswith("8.")
    assert pins["nbval"].startswith("0.11.")


def test_ci_runs_the_readme_test_command_then_the_browser_test():
    readme = (ROOT / "README.md").read_text()
    assert "make test " in readme  # the README's test command
    assert "make test-browser" in (ROOT / "docs" / "commands.md").read_text()
    commands = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert commands[2] == "make test"  # after `set -euo pipefail` and `cd`
    assert commands[-1] == "GRADACCUM_REQUIRE_BROWSER=1 make test-browser"


def test_the_readme_is_a_landing_page_of_at_most_12000_characters():
    size = len((ROOT / "README.md").read_bytes())  # as `wc -c` counts
    assert size <= 12000, f"README.md is {size} bytes: move details into docs/"


def test_notebooks_are_committed_executed_in_order_without_errors():
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks, "no notebooks found"
    for path in notebooks:
        assert re.fullmatch(r"\d\d[a-z]?_[a-z0-9_]+\.ipynb", path.name), path.name
        notebook = json.loads(path.read_text())
        code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
        counts = [cell["execution_count"] for cell in code]
        assert counts == list(range(1, len(code) + 1)), f"{path.name}: re-run `make notebooks`"
        errors = [o for cell in code for o in cell["outputs"] if o["output_type"] == "error"]
        assert not errors, f"{path.name}: committed with an error output"
        assert notebook["metadata"]["kernelspec"]["name"] == "python3"


def test_nbval_cell_tags_are_ones_nbval_knows_and_no_marker_comments_remain():
    # readers should not see "# NBVAL_..." lines; a misspelled tag is silently ignored by nbval
    from nbval.plugin import metadata_tags

    tagged = 0
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            assert "NBVAL_" not in "".join(cell["source"]), f"{path.name}: a marker comment"
            for tag in cell.get("metadata", {}).get("tags", []):
                if tag.startswith("nbval") or "exception" in tag:
                    assert tag in metadata_tags, f"{path.name}: unknown nbval tag {tag!r}"
                    tagged += 1
    assert tagged > 0
