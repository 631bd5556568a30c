"""Load a repository script (``scripts/*.py``, ``benchmarks/run.py``) as a module, for its tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load_script(relative_path: str) -> ModuleType:
    """Return the script at ``ROOT / relative_path`` imported as a module (once per session),
    registered in ``sys.modules`` (dataclasses look their module up by name) as
    ``script_<folder>_<stem>``."""
    path = ROOT / relative_path
    name = f"script_{path.parent.name}_{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
