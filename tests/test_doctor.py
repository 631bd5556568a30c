"""scripts/doctor.py (`make doctor`): one line per check, the fix for each failure, exit code."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "doctor.py"
doctor = load_script("scripts/doctor.py")

LINE = re.compile(r"^(OK|WARN|FAIL) +([a-z_]+): (.+)$")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_script_prints_one_line_per_check_and_exits_by_its_failures():
    port = _free_port()
    env = {**os.environ, "LAB_PORT": str(port), "GRADACCUM_PROFILE": "ci"}
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                            env=env, timeout=120, cwd=ROOT)
    lines = result.stdout.splitlines()
    parsed = [match for match in map(LINE.match, lines) if match]
    names = [match.group(2) for match in parsed]
    assert names == ["python", "packages", "torch", "device", "profile", "cjk_font", "chromium",
                     "port"], (
        result.stdout + result.stderr)
    failed = [match.group(2) for match in parsed if match.group(1) == "FAIL"]
    for match in parsed:
        if match.group(1) != "OK":
            assert "-> fix: " in match.group(3), match.group(0)
    assert result.returncode == (1 if failed else 0), result.stdout + result.stderr
    if failed:
        assert lines[-1] == f"{len(failed)} check(s) failed: {', '.join(failed)}"
    else:
        assert len(lines) == len(parsed)
    by_name = {match.group(2): match for match in parsed}
    assert by_name["python"].group(1) == ("OK" if sys.version_info[:2] == (3, 11) else "FAIL")
    assert by_name["profile"].group(0).startswith("OK   profile: ci (GRADACCUM_PROFILE=ci)")
    assert by_name["port"].group(0) == (
        f"OK   port: {port} (LAB_PORT) is free on 127.0.0.1 for `make lab`")
    assert re.search(r"(CPU|CUDA [\d.]+) build", by_name["torch"].group(3))
    assert re.match(r"(cpu|cuda|mps)\b", by_name["device"].group(3))


def test_parse_pins_reads_dependencies_and_the_dev_extra():
    text = """
[project]
name = "x"
dependencies = ["torch==2.13.0", "Jupyter_Server == 2.0.1"]
[project.optional-dependencies]
dev = ["nbconvert==7.17.2"]
other = ["ignored==1.0"]
"""
    assert doctor.parse_pins(text) == {"torch": "2.13.0", "jupyter-server": "2.0.1",
                                       "nbconvert": "7.17.2"}
    real = doctor.parse_pins((ROOT / "pyproject.toml").read_text())
    assert real["torch"] == "2.13.0" and "pytest" in real and "nbconvert" in real
    with pytest.raises(ValueError, match=r"'numpy>=2' is not an exact pin"):
        doctor.parse_pins('[project]\ndependencies = ["numpy>=2"]\n')


def test_a_wrong_or_missing_pin_fails_with_the_fix():
    installed = {"torch": "2.12.0", "numpy": "2.4.6"}

    def version(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    check = doctor.check_pins({"torch": "2.13.0", "numpy": "2.4.6", "tqdm": "4.70.1"}, version)
    assert check.status == "FAIL"
    assert "not installed: tqdm" in check.message
    assert "wrong version: torch 2.12.0 (pinned 2.13.0)" in check.message
    assert "numpy" not in check.message
    assert check.line().startswith("FAIL packages: ") and "-> fix: `make setup`" in check.line()
    ok = doctor.check_pins({"torch": "2.13.0"}, lambda name: "2.13.0+cpu")  # local label
    assert ok.status == "OK" and "-> fix" not in ok.line()
    assert not doctor.matches("2.13.0+cpu", "2.13.0+cu128")


def test_main_exits_non_zero_on_any_failure(capsys):
    passing = doctor.Check("OK", "python", "3.11.7")
    warning = doctor.Check("WARN", "chromium", "missing", "apt-get install chromium")
    failing = doctor.Check("FAIL", "packages", "wrong version: torch", "make setup")
    assert doctor.main([passing, warning]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "OK   python: 3.11.7", "WARN chromium: missing -> fix: apt-get install chromium"]
    assert doctor.main([passing, failing]) == 1
    assert capsys.readouterr().out.splitlines()[1:] == [
        "FAIL packages: wrong version: torch -> fix: make setup", "1 check(s) failed: packages"]


def test_python_profile_chromium_and_port_checks(tmp_path):
    assert doctor.check_python((3, 11, 9)).status == "OK"
    wrong = doctor.check_python((3, 12, 1))
    assert wrong.status == "FAIL" and "3.12.1" in wrong.message and "3.11" in wrong.fix

    from gradaccum_lib.runtime import get_profile

    assert doctor.check_profile(get_profile, {}).status == "OK"
    cpu = doctor.check_profile(get_profile, {"GRADACCUM_PROFILE": "cpu"})
    assert cpu.status == "WARN" and "differ from the committed outputs (ci)" in cpu.message
    bogus = doctor.check_profile(get_profile, {"GRADACCUM_PROFILE": "huge"})
    assert bogus.status == "FAIL" and "'huge'" in bogus.message

    missing = doctor.check_chromium(tmp_path / "chromium")
    assert missing.status == "WARN" and "apt-get install chromium" in missing.fix

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        taken = doctor.check_port(port)
    assert taken.status == "WARN" and f"LAB_PORT={port + 1} make lab" in taken.fix
    assert doctor.check_port(_free_port()).status == "OK"


def test_the_cjk_font_check_names_the_font_or_the_package_to_install():
    found = doctor.check_cjk_font(lambda: "Noto Sans CJK SC")
    assert found.line() == "OK   cjk_font: Noto Sans CJK SC, for the Chinese card and pages"
    missing = doctor.check_cjk_font(lambda: None)
    assert missing.status == "WARN" and "show boxes" in missing.message
    assert LINE.match(missing.line()) and "-> fix: " in missing.line()  # one line, with the fix
    assert "apt-get install fonts-noto-cjk" in missing.fix
    assert "macOS and Windows ship one" in missing.fix


def _fake_fc_list(stdout: str, returncode: int = 0):  # noqa: ANN202
    def run(command, **_):  # noqa: ANN001, ANN003, ANN202
        assert command == ["fc-list", ":lang=zh", "family"]
        return subprocess.CompletedProcess(command, returncode, stdout, "")
    return run


def test_the_cjk_probe_asks_fontconfig_where_fc_list_exists(monkeypatch):
    monkeypatch.setattr(doctor.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(doctor.subprocess, "run", _fake_fc_list(
        "Noto Serif CJK SC,Noto Serif CJK SC SemiBold\nNoto Sans CJK SC,Noto Sans CJK SC Bold\n"))
    assert doctor.find_cjk_font() == "Noto Sans CJK SC"
    monkeypatch.setattr(doctor.subprocess, "run", _fake_fc_list(""))  # no font for :lang=zh
    assert doctor.find_cjk_font() is None


def test_without_fc_list_the_cjk_probe_reads_matplotlibs_fonts(monkeypatch, tmp_path):
    import matplotlib
    from matplotlib import font_manager, ft2font

    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)
    latin, chinese = tmp_path / "latin.ttf", tmp_path / "chinese.ttc"
    # matplotlib's own Last Resort font maps every character, to a box: left out
    last_resort = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "LastResortHE-Regular.ttf"
    maps = {str(latin): {ord("a"): 1}, str(chinese): {ord("中"): 1, ord("文"): 2},
            str(last_resort): {ord("中"): 1, ord("文"): 1}}

    class FakeFont:
        def __init__(self, fname: str) -> None:
            self.fname = fname

        def get_charmap(self) -> dict[int, int]:
            return maps[self.fname]

    def entry(path: Path, name: str) -> font_manager.FontEntry:
        return font_manager.FontEntry(fname=str(path), name=name)

    monkeypatch.setattr(ft2font, "FT2Font", FakeFont)
    monkeypatch.setattr(font_manager.fontManager, "ttflist",
                        [entry(latin, "Latin"), entry(last_resort, "Last Resort High-Efficiency")])
    assert doctor.find_cjk_font() is None
    monkeypatch.setattr(font_manager.fontManager, "ttflist",
                        [entry(latin, "Latin"), entry(chinese, "PingFang SC")])
    assert doctor.find_cjk_font() == "PingFang SC"
