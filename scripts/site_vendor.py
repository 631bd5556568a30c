"""The JavaScript the static site loads, vendored with ``npm pack`` (used by build_site.py).

Two bundles, each fetched once at a pinned version into its own folder of the vendor cache
(``build/site-vendor/``) and copied next to the pages, so that the site works offline:

* the widget manager: @jupyter-widgets/html-manager's ``embed-amd.js`` (and the icon fonts its
  CSS loads) with ``require.js``, in ``build/site-vendor/widgets/``;
* MathJax 3: ``tex-chtml-full.js`` (every TeX package built in, nothing loaded on demand) and
  the CHTML fonts it loads, in ``build/site-vendor/mathjax/``.

A cache folder is complete or absent, never half there. Each bundle is chosen by a word:
``auto`` (the cache, else ``npm``, else the CDN, said in the note), ``npm``, ``cdn``, or a folder
that already holds the files.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "build" / "site-vendor"
VENDOR_CACHE = VENDOR / "widgets"
MATHJAX_CACHE = VENDOR / "mathjax"
# the widget manager that matches ipywidgets 8.1 (widget state version 2), and an AMD loader
HTML_MANAGER = "@jupyter-widgets/html-manager@1.0.15"
REQUIREJS = "requirejs@2.3.7"
VENDOR_FILES = ("embed-amd.js", "require.js")
MATHJAX = "mathjax@3.2.2"
MATHJAX_ENTRY = "tex-chtml-full.js"
MATHJAX_FILES = (MATHJAX_ENTRY,)
# where MathJax looks for its fonts, relative to the entry point ("[mathjax]/output/...")
MATHJAX_FONTS = Path("output", "chtml", "fonts", "woff-v2")
MATHJAX_CDN = f"https://cdn.jsdelivr.net/npm/{MATHJAX}/es5/{MATHJAX_ENTRY}"


def _npm_pack(package: str, into: Path) -> Path:
    """``npm pack package`` into ``into``, unpacked; returns the package folder."""
    result = subprocess.run(["npm", "pack", "--silent", package], cwd=into, capture_output=True,
                            text=True, timeout=300, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"`npm pack {package}` failed: {result.stderr.strip()[-500:]}")
    archive = into / result.stdout.strip().splitlines()[-1]
    target = into / archive.name.removesuffix(".tgz")
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    return target / "package"


def _fill(cache: Path, files: tuple[str, ...], packages: tuple[str, ...],
          copy: Callable[[list[Path], Path], None]) -> Path:
    """``cache``, filled unless it holds ``files``: ``packages`` are packed with npm and
    ``copy(their folders, partial)`` picks what is kept; the folder then replaces ``cache``."""
    if all((cache / name).is_file() for name in files):
        return cache
    if shutil.which("npm") is None:
        raise RuntimeError("npm is not installed (Debian: apt-get install npm)")
    with tempfile.TemporaryDirectory() as scratch:
        folders = [_npm_pack(package, Path(scratch)) for package in packages]
        partial = cache.with_name(cache.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        copy(folders, partial)
        (partial / "VERSIONS").write_text("".join(f"{package}\n" for package in packages))
        shutil.rmtree(cache, ignore_errors=True)
        partial.rename(cache)  # complete or absent, never half there
    return cache


def _copy_widget_files(folders: list[Path], into: Path) -> None:
    manager, requirejs = folders
    for path in (manager / "dist").iterdir():
        # the AMD bundle and the icon fonts its CSS loads; not the standalone bundle or maps
        if path.name == "embed-amd.js" or path.suffix in {".woff2", ".woff", ".ttf", ".eot",
                                                          ".svg"}:
            shutil.copy2(path, into / path.name)
    shutil.copy2(requirejs / "require.js", into / "require.js")


def _copy_mathjax(folders: list[Path], into: Path) -> None:
    (package,) = folders
    shutil.copy2(package / "es5" / MATHJAX_ENTRY, into / MATHJAX_ENTRY)
    shutil.copytree(package / "es5" / MATHJAX_FONTS, into / MATHJAX_FONTS)
    shutil.copy2(package / "LICENSE", into / "LICENSE")


def fetch_widget_files(cache: Path = VENDOR_CACHE) -> Path:
    """The pinned html-manager (``embed-amd.js`` and its fonts) and ``require.js`` in ``cache``,
    fetched with ``npm pack`` unless already there. Returns ``cache``."""
    return _fill(cache, VENDOR_FILES, (HTML_MANAGER, REQUIREJS), _copy_widget_files)


def fetch_mathjax(cache: Path = MATHJAX_CACHE) -> Path:
    """The pinned MathJax's ``tex-chtml-full.js`` and its fonts in ``cache``, fetched with
    ``npm pack`` unless already there. Returns ``cache``."""
    return _fill(cache, MATHJAX_FILES, (MATHJAX,), _copy_mathjax)


def _resolve(choice: str, flag: str, files: tuple[str, ...], fetch: Callable[[], Path],
             what: str, cdn: str) -> tuple[Path | None, str]:
    if choice == "cdn":
        return None, f"{what} from {cdn} (the reader needs the internet)"
    if choice not in {"auto", "npm"}:
        folder = Path(choice)
        absent = [name for name in files if not (folder / name).is_file()]
        if absent:
            raise ValueError(f"{flag} {choice}: not a folder holding {', '.join(absent)} "
                             "(or use auto, cdn, npm)")
        return folder, f"{what} copied from {folder} (works offline)"
    try:
        folder = fetch()
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        if choice == "npm":
            raise
        return None, f"{what} from {cdn}: the offline copy could not be fetched ({error})"
    stamp = folder / "VERSIONS"
    versions = ", ".join(stamp.read_text().split()) if stamp.is_file() else "cached"
    return folder, f"{what} ({versions}) next to the pages (works offline)"


def resolve_widgets(choice: str, cache: Path = VENDOR_CACHE) -> tuple[Path | None, str]:
    """The folder of widget files to copy (None: load them from the CDN) and a sentence on it."""
    return _resolve(choice, "--widgets", VENDOR_FILES, lambda: fetch_widget_files(cache),
                    "widget JavaScript", "unpkg.com and cdnjs")


def resolve_mathjax(choice: str, cache: Path = MATHJAX_CACHE) -> tuple[Path | None, str]:
    """The folder of MathJax files to copy (None: load it from the CDN) and a sentence on it."""
    return _resolve(choice, "--mathjax", MATHJAX_FILES, lambda: fetch_mathjax(cache),
                    "MathJax", "cdn.jsdelivr.net")


def copy_static(out: Path, name: str, folder: Path | None) -> str | None:
    """``folder`` copied to ``out/_static/name``; returns that path in the site (None: none)."""
    target = out / "_static" / name
    shutil.rmtree(target, ignore_errors=True)
    if folder is None:
        return None
    shutil.copytree(folder, target)
    return f"_static/{name}"
