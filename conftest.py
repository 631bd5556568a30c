"""Repository-wide pytest hooks (unit tests and nbval runs alike)."""

from __future__ import annotations

import torch

torch.set_num_threads(1)

# the Chinese twins' code and outputs are the English notebooks' (tests/test_twins.py checks it):
# nbval runs the English notebooks only
collect_ignore_glob = ["notebooks/zh/*"]


def pytest_collectstart(collector):  # noqa: ANN001 - pytest hook signature
    """nbval: stderr (warnings, progress bars) carries no claim, so it is never compared."""
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr",)
