"""gradaccum_course: what serves the notebooks of the gradaccum series, not the learner's own
code: the exercise checkers (``exercises``), the sliders (``widgets``) and figures
(``plots``), the audits of other frameworks (``audits``), starting ``torchrun`` from a
notebook (``launch``) and the programs a notebook runs under it (``programs``). It imports
the learner's library, ``gradaccum_lib``; the library never imports it. What it says to a reader
follows the reader's language (:func:`language`)."""


import os
from pathlib import Path

__all__ = ["build_dir", "checkout", "language"]

#: overrides where the notebooks write their programs and results
BUILD_VARIABLE = "GRADACCUM_BUILD"
#: names the checkout when the notebooks run from a copy outside it (a test's lab folder)
CHECKOUT_VARIABLE = "GRADACCUM_CHECKOUT"
#: overrides the reader's language (``en`` or ``zh``)
LANGUAGE_VARIABLE = "GRADACCUM_LANGUAGE"


def build_dir() -> Path:
    """Return the folder the notebooks write to, created: ``$GRADACCUM_BUILD`` if set, else
    ``build/`` in :func:`checkout` (the same folder from an English notebook, its Chinese twin
    or a solution), as a path relative to the current folder."""
    chosen = os.environ.get(BUILD_VARIABLE)
    folder = (Path(chosen) if chosen else
              Path(os.path.relpath(checkout() / "build", Path.cwd().resolve())))
    folder.mkdir(parents=True, exist_ok=True)
    return folder  # relative to here unless chosen: what a cell prints holds no home folder


def checkout() -> Path:
    """Return the checkout of the series: ``$GRADACCUM_CHECKOUT`` if set, else the nearest
    folder up from the current one with a ``pyproject.toml`` and ``notebooks/`` (the current
    folder if none is)."""
    if os.environ.get(CHECKOUT_VARIABLE):
        return Path(os.environ[CHECKOUT_VARIABLE])
    here = Path.cwd().resolve()
    return next((folder for folder in (here, *here.parents)
                 if (folder / "pyproject.toml").is_file() and (folder / "notebooks").is_dir()),
                here)


def language() -> str:
    """Return the reader's language, which the checkers' feedback and the sliders' labels
    follow: ``"zh"`` in a kernel started in the Chinese edition (``notebooks/zh/`` or its
    ``solutions/``), else ``"en"``; ``GRADACCUM_LANGUAGE=en|zh`` overrides."""
    chosen = os.environ.get(LANGUAGE_VARIABLE)
    if chosen in ("en", "zh"):
        return chosen
    parts = Path.cwd().parts
    return "zh" if "notebooks" in parts and "zh" in parts[parts.index("notebooks"):] else "en"
