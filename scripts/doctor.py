"""What is set up and what is missing, before `make lab` / `make test` fail on it (`make doctor`).

One line per check: ``OK``, ``WARN`` (works, but not as the committed outputs or the tests
expect) or ``FAIL`` (something the series needs), each FAIL and WARN with the fix. The exit
code is 1 when any check FAILs, else 0. Nothing is installed or written.

Checks: the Python version (3.11); every ``==`` pin of pyproject.toml (``dependencies`` and the
``dev`` extra) against the installed distribution; torch's build (CPU or CUDA) and the device
the notebooks will use; the size profile (``GRADACCUM_PROFILE``); a font with Chinese
characters (without one, 00's Chinese answer card and the site's Chinese pages show boxes);
Chromium for the browser test; the port `make lab` listens on (8888, or ``$LAB_PORT``).

Usage: python scripts/doctor.py   (``make doctor`` runs it with .venv's Python)
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = (3, 11)
CHROMIUM = Path("/usr/bin/chromium")
DEFAULT_PORT = 8888
COMMITTED_PROFILE = "ci"
PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9_.\-]*)\s*==\s*([^\s;,]+)\s*$")
CPU_TORCH = ("pip install torch=={version} --index-url https://download.pytorch.org/whl/cpu")
CJK_PROBE = "中文"  # characters a font must draw to show the Chinese pages
CJK_FONT_FIX = ("Debian/Ubuntu: `sudo apt-get install fonts-noto-cjk` (then restart the "
                "browser); macOS and Windows ship one (PingFang SC, Microsoft YaHei)")


@dataclass(frozen=True)
class Check:
    status: str  # "OK", "WARN" or "FAIL"
    name: str
    message: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status:<4} {self.name}: {self.message}"
        return f"{text} -> fix: {self.fix}" if self.fix and self.status != "OK" else text


def parse_pins(pyproject_text: str) -> dict[str, str]:
    """The exact (``name==version``) pins of ``dependencies`` and the ``dev`` extra.

    Names are normalised (lower case, ``-`` for ``_`` and ``.``). A requirement that is not
    an exact pin raises ValueError naming it: the series pins everything exactly.
    """
    project = tomllib.loads(pyproject_text)["project"]
    requirements = (list(project.get("dependencies", []))
                    + list(project.get("optional-dependencies", {}).get("dev", [])))
    pins: dict[str, str] = {}
    for requirement in requirements:
        match = PIN.match(requirement)
        if match is None:
            raise ValueError(f"pyproject.toml: {requirement!r} is not an exact pin "
                             "(name==version)")
        pins[normalise(match.group(1))] = match.group(2)
    return pins


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def matches(installed: str, pinned: str) -> bool:
    """``installed`` satisfies ``==pinned`` (PEP 440: a pin without a local label such as
    ``+cpu`` ignores the installed version's, so torch 2.13.0+cpu satisfies ==2.13.0)."""
    if "+" not in pinned:
        installed = installed.split("+", 1)[0]
    return installed == pinned


def check_python(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> Check:
    found = ".".join(map(str, version))
    where = sys.executable
    if tuple(version[:2]) == PYTHON:
        return Check("OK", "python", f"{found} ({where})")
    wanted = ".".join(map(str, PYTHON))
    return Check("FAIL", "python", f"{found} ({where}), the series is pinned for {wanted}",
                 f"install Python {wanted}, then `make clean && make setup "
                 f"PYTHON=python{wanted}`")


def check_pins(pins: dict[str, str],
               version: Callable[[str], str] = importlib.metadata.version) -> Check:
    """Each pinned package installed at its pin (``version`` is importlib.metadata's)."""
    missing, wrong = [], []
    for name, pinned in pins.items():
        try:
            installed = version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if not matches(installed, pinned):
            wrong.append(f"{name} {installed} (pinned {pinned})")
    if not missing and not wrong:
        return Check("OK", "packages", f"all {len(pins)} pins of pyproject.toml installed "
                                       "(dependencies + dev)")
    problems = ([f"not installed: {', '.join(missing)}"] if missing else []) + (
        [f"wrong version: {', '.join(wrong)}"] if wrong else [])
    fix = ("`make setup` (or `.venv/bin/pip install -e '.[dev]'`); in the conda env: "
           "`pip install -e '.[dev]'`")
    if not sys.prefix.endswith(".venv") and os.environ.get("CONDA_PREFIX") is None:
        fix += f" -- note: this is {sys.executable}, not .venv's Python"
    return Check("FAIL", "packages", "; ".join(problems), fix)


def check_torch() -> list[Check]:
    """torch's build (CPU / CUDA), the device the notebooks use, and the active profile."""
    try:
        import torch
    except ImportError as error:
        return [Check("FAIL", "torch", f"cannot import torch: {error}", "`make setup`")]
    cuda_build = torch.version.cuda
    build = f"CUDA {cuda_build} build" if cuda_build else "CPU build"
    checks = []
    gpu_present = shutil.which("nvidia-smi") is not None
    if cuda_build and not torch.cuda.is_available():
        checks.append(Check(
            "WARN", "torch", f"{torch.__version__}, {build}, but no usable GPU here",
            "on a CPU-only machine the CPU build is enough and far smaller: "
            + CPU_TORCH.format(version=torch.__version__.split("+")[0])))
    elif not cuda_build and gpu_present:
        checks.append(Check(
            "WARN", "torch", f"{torch.__version__}, {build}, but nvidia-smi finds a GPU",
            "install the CUDA build from PyTorch's wheel index for your CUDA version, e.g. "
            "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"))
    else:
        checks.append(Check("OK", "torch", f"{torch.__version__}, {build}"))
    try:
        sys.path.insert(0, str(ROOT))
        from gradaccum_lib.runtime import choose_device, get_profile
    except ImportError as error:
        checks.append(Check("FAIL", "gradaccum_lib", f"cannot import it: {error}",
                            "`make setup` installs it (editable) into .venv"))
        return checks
    device = choose_device()
    name = ""
    if device.type == "cuda":
        name = f" ({torch.cuda.get_device_name(device)}, {torch.cuda.device_count()} visible)"
    checks.append(Check("OK", "device", f"{device}{name}: the notebooks run there"))
    checks.append(check_profile(get_profile))
    return checks


def check_profile(get_profile: Callable[[str | None], object],
                  environ: dict[str, str] | None = None) -> Check:
    environ = os.environ if environ is None else environ
    chosen = environ.get("GRADACCUM_PROFILE") or None
    lab = chosen or COMMITTED_PROFILE
    try:
        plain = get_profile(chosen).name
        get_profile(lab)
    except ValueError as error:
        return Check("FAIL", "profile", str(error),
                     "set GRADACCUM_PROFILE to ci, cpu or gpu, or unset it")
    where = (f"GRADACCUM_PROFILE={chosen}" if chosen
             else f"unset: `make lab` uses {COMMITTED_PROFILE}, a plain `jupyter lab` or "
                  f"python uses {plain}")
    if lab != COMMITTED_PROFILE:
        return Check("WARN", "profile",
                     f"{lab} ({where}): numbers and figures will differ from the committed "
                     f"outputs ({COMMITTED_PROFILE})",
                     f"unset GRADACCUM_PROFILE to see the committed numbers; `make test` "
                     f"always uses {COMMITTED_PROFILE}")
    return Check("OK", "profile", f"{lab} ({where}), the committed outputs' sizes")


def find_cjk_font() -> str | None:
    """The name of an installed font that draws Chinese, or None: fontconfig's
    ``fc-list :lang=zh`` where fc-list exists (what Linux browsers use), else the first font
    of matplotlib's font manager whose character map has :data:`CJK_PROBE` (matplotlib's own
    fonts left out: a browser does not see them, and its Last Resort font maps every character
    to a box)."""
    if shutil.which("fc-list"):
        try:
            result = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True,
                                    text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            result = None
        if result is not None and result.returncode == 0:
            families = [line.split(",")[0].strip() for line in result.stdout.splitlines()]
            return next((family for family in sorted(families) if family), None)
    import matplotlib
    from matplotlib import font_manager, ft2font

    bundled = Path(matplotlib.get_data_path()).resolve()
    for entry in font_manager.fontManager.ttflist:
        if Path(entry.fname).resolve().is_relative_to(bundled):
            continue
        try:
            charmap = ft2font.FT2Font(entry.fname).get_charmap()
        except (OSError, RuntimeError, ValueError):
            continue
        if all(ord(character) in charmap for character in CJK_PROBE):
            return entry.name
    return None


def check_cjk_font(probe: Callable[[], str | None] = find_cjk_font) -> Check:
    font = probe()
    if font is None:
        return Check("WARN", "cjk_font", "no font with Chinese characters: 00's Chinese answer "
                                         "card and the site's Chinese pages show boxes",
                     CJK_FONT_FIX)
    return Check("OK", "cjk_font", f"{font}, for the Chinese card and pages")


def check_chromium(path: Path = CHROMIUM) -> Check:
    fix = "`apt-get install chromium` (Debian); only `make test-browser` needs it"
    if not (path.is_file() and os.access(path, os.X_OK)):
        return Check("WARN", "chromium", f"{path} not found: `make test-browser` will skip",
                     fix)
    try:
        result = subprocess.run([str(path), "--version"], capture_output=True, text=True,
                                timeout=30, check=False)
        version = result.stdout.strip() or result.stderr.strip().splitlines()[-1]
    except (OSError, subprocess.TimeoutExpired, IndexError) as error:
        return Check("WARN", "chromium", f"{path} does not run: {error}", fix)
    return Check("OK", "chromium", f"{version} ({path}), for `make test-browser`")


def check_port(port: int | None = None, host: str = "127.0.0.1") -> Check:
    if port is None:
        try:
            port = int(os.environ.get("LAB_PORT") or DEFAULT_PORT)
        except ValueError:
            return Check("FAIL", "port", f"LAB_PORT={os.environ['LAB_PORT']!r} is not a number",
                         "LAB_PORT=8890 make lab")
    label = "the default" if port == DEFAULT_PORT else "LAB_PORT"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Jupyter's server
        try:
            probe.bind((host, port))
        except OSError as error:
            return Check("WARN", "port",
                         f"{port} ({label}) on {host} is taken ({error.strerror}): `make lab` "
                         "would move to the next free port",
                         f"stop what listens there (`ss -ltnp 'sport = :{port}'`), or "
                         f"`LAB_PORT={port + 1} make lab` (and forward that port)")
    return Check("OK", "port", f"{port} ({label}) is free on {host} for `make lab`")


def run_checks() -> list[Check]:
    checks = [check_python()]
    try:
        pins = parse_pins((ROOT / "pyproject.toml").read_text())
    except (OSError, ValueError, KeyError) as error:
        checks.append(Check("FAIL", "packages", f"cannot read the pins: {error}",
                            "restore pyproject.toml (`git diff pyproject.toml`)"))
    else:
        checks.append(check_pins(pins))
    checks.extend(check_torch())
    checks.append(check_cjk_font())
    checks.append(check_chromium())
    checks.append(check_port())
    return checks


def main(checks: list[Check] | None = None) -> int:
    checks = run_checks() if checks is None else checks
    for check in checks:
        print(check.line(), flush=True)
    failed = [check.name for check in checks if check.status == "FAIL"]
    if failed:
        print(f"{len(failed)} check(s) failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
