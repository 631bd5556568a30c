"""How fast the denominator lab (notebook 03) answers a move: every preset at every number of
ranks (1-4) and k (1-8), the work one move does (measure the window, draw the figure, encode
the PNG the widget shows), timed one after another in one process on one thread.

    python benchmarks/lab_response.py      # writes benchmarks/lab_response.json

The target (issue 50) is one second on 2 CPU cores; the result is the median and the slowest
move. A move's time is absolute, not a ratio: run it on an idle machine.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from gradaccum_course.denominator_lab import PRESETS, measure_window, plot_window, preset_layout

OUT = Path(__file__).resolve().parent / "lab_response.json"


def one_move(preset: str, ranks: int, k: int) -> float:
    """Seconds for what the widget does on one move."""
    start = time.perf_counter()
    layout = preset_layout(preset, ranks, k)
    if any(n for rank in layout for micro in rank for n in micro):
        figure = plot_window(measure_window(layout, k))
        figure.savefig(io.BytesIO(), format="png", dpi=192)
    return time.perf_counter() - start


def main() -> int:
    torch.set_num_threads(1)
    one_move("uneven tokens", 2, 4)  # warm-up: imports, the first figure
    cases = list(itertools.product(PRESETS, range(1, 5), range(1, 9)))
    times = {f"{p} | {r} ranks | k={k}": one_move(p, r, k)
             for p, r, k in tqdm(cases, desc="lab moves", file=sys.stderr)}
    slowest = max(times, key=times.get)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                .splitlines() if line.startswith("model name")), None) if Path(
                    "/proc/cpuinfo").exists() else None
    result = {"machine": f"{cpu or platform.processor() or platform.machine()}, "
                         f"{os.cpu_count()} cores, torch {torch.__version__}",
              "moves": len(times), "median_s": statistics.median(times.values()),
              "max_s": times[slowest], "slowest": slowest, "target_s": 1.0,
              "met": times[slowest] <= 1.0}
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
