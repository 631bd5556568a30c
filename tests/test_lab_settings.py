"""`make lab` installs JupyterLab defaults into the venv (not ~/.jupyter): no news pop-up, and a
file browser without its "Last Modified" column, so that the notebooks' names are not cut short.

The Makefile's `lab-settings` step (a prerequisite of `lab`) is run into a temporary settings
directory; the file it installs is then read by jupyterlab_server's own loader against the
installed JupyterLab's schema, so a misspelt plugin, key or value fails here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "@jupyterlab/apputils-extension:notification"
BROWSER = "@jupyterlab/filebrowser-extension:browser"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def _make(*args: str, home: Path) -> str:
    environment = {**os.environ, "HOME": str(home), "MAKEFLAGS": ""}
    return subprocess.run(["make", "-s", "--no-print-directory", "-C", str(ROOT), *args],
                          env=environment, capture_output=True, text=True, check=True,
                          timeout=60).stdout


@pytest.fixture
def installed(tmp_path: Path) -> tuple[Path, Path]:
    """The settings directory `make lab-settings` filled, and an empty HOME it ran under."""
    home = tmp_path / "home"
    home.mkdir()
    settings = tmp_path / "settings"
    _make("lab-settings", f"LAB_SETTINGS={settings}", home=home)
    return settings, home


def _schema_dir(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("JUPYTERLAB_DIR", raising=False)
    from jupyterlab.commands import get_app_dir

    return Path(get_app_dir()) / "schemas"


def test_make_installs_an_override_that_turns_the_news_off(installed, monkeypatch) -> None:
    settings, home = installed
    installed_files = sorted(p.relative_to(settings) for p in settings.rglob("*") if p.is_file())
    assert installed_files == [Path("overrides.d/gradaccum.json")]
    overrides = json.loads((settings / "overrides.d" / "gradaccum.json").read_text())
    assert overrides == {PLUGIN: {"fetchNews": "false"},
                         BROWSER: {"showLastModifiedColumn": False}}
    assert list(home.iterdir()) == []  # nothing written to the user's own settings

    # the key and value against the installed JupyterLab's schema ("false" is "Never")
    schemas = _schema_dir(monkeypatch)
    package, _, plugin = PLUGIN.partition(":")
    schema = json.loads((schemas / package / f"{plugin}.json").read_text())
    choices = {choice["const"]: choice["title"] for choice in
               schema["properties"]["fetchNews"]["oneOf"]}
    assert choices["false"] == "Never"

    # what JupyterLab's settings API serves: the override as the default, no user setting
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(home / ".jupyter"))  # no ~/.jupyter layering
    from jupyterlab_server.settings_utils import get_settings

    result, warnings = get_settings(str(settings), str(schemas), str(home / "user-settings"),
                                    schema_name=PLUGIN)
    assert not [w for w in warnings if w]
    assert result["schema"]["properties"]["fetchNews"]["default"] == "false"
    assert result["raw"] == "{}"  # the user's own settings: untouched, and they still win
    browser, warnings = get_settings(str(settings), str(schemas), str(home / "user-settings"),
                                     schema_name=BROWSER)
    assert not [w for w in warnings if w]
    assert browser["schema"]["properties"]["showLastModifiedColumn"]["default"] is False


def test_make_lab_installs_it_where_the_venvs_jupyterlab_reads_it(monkeypatch) -> None:
    dry_run = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(ROOT), "-B", "-n",
                              "lab-settings"], capture_output=True, text=True, check=True,
                             timeout=60).stdout
    target = ".venv/share/jupyter/lab/settings/overrides.d/gradaccum.json"
    assert f"cp jupyter/lab-overrides.json {target}" in dry_run
    lab = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(ROOT), "-n", "-p",
                          "lab"], capture_output=True, text=True, timeout=60).stdout
    assert any(line.startswith("lab:") and target in line for line in lab.splitlines())
    # JupyterLab run from a venv reads <sys.prefix>/share/jupyter/lab/settings
    monkeypatch.delenv("JUPYTERLAB_DIR", raising=False)
    from jupyterlab.labapp import LabApp

    assert Path(LabApp().app_settings_dir) == Path(sys.prefix) / "share/jupyter/lab/settings"


def test_every_notebook_names_the_kernel_jupyterlab_writes() -> None:
    # JupyterLab rewrites a notebook's kernelspec to the running kernel's on open; one that
    # differs ("Python 3" instead of "Python 3 (ipykernel)") marks it modified, and closing it
    # asks to save a tracked file
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    expected = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    specs = {str(path.relative_to(root)): json.loads(path.read_text())["metadata"]["kernelspec"]
             for path in sorted((root / "notebooks").rglob("*.ipynb"))}
    assert {path: spec for path, spec in specs.items() if spec != expected} == {}
