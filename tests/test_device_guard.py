"""The device rule for the code a reader copies (00's card loops, 05's plain loop and the
correct loop of its sync-flag program, which its other trap programs reuse): every
tensor handed to a collective lives on the model's device, so the same code runs under gloo
on a CPU and under nccl on GPUs.

What the guard catches: a tensor passed to a ``torch.distributed`` collective that was built
without ``device=`` (or on a fixed device) while the model lives elsewhere; the worker makes
the default device ``meta`` so that such a tensor differs from the CPU model's device. What it
does not catch: a collective called outside these functions (the programs' ``__main__``
blocks, which only ``make gpu-check`` runs under nccl), a backend chosen wrongly, or a tensor
moved to the wrong GPU index; ``make gpu-check`` proves those on a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parent.parent
GUARD = ROOT / "tests" / "workers" / "device_guard.py"
written_program = load_script("scripts/gpu_check.py").written_program

CARD = ("00_the_article.ipynb", "answer_loop.py", "card")
PLAIN = ("05_ddp_torchrun.ipynb", "plain_ddp_loop.py", "plain")
SYNC_FLAG = ("05_ddp_torchrun.ipynb", "sync_flag.py", "sync_flag")
CPU_COUNT = {  # the count tensor put back on the default device, as the card once had it
    "card": ("for _, y in window)), device=device)", "for _, y in window)))"),
    "plain": ("for _, labels in window)),\n                         device=device)",
              "for _, labels in window)))"),
    "sync_flag": ("for _, labels in window)),\n                         "
                  "device=next(model.parameters()).device)", "for _, labels in window)))"),
}


def _guarded(program: str, kind: str, folder: Path) -> dict[str, str]:
    path, out = folder / f"{kind}.py", folder / f"{kind}.json"
    path.write_text(program)
    done = subprocess.run([sys.executable, str(GUARD), str(path), kind, "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize(("notebook", "name", "kind"), [CARD, PLAIN, SYNC_FLAG])
def test_the_readers_loops_hand_collectives_tensors_on_the_models_device(
        notebook, name, kind, tmp_path):
    results = _guarded(written_program(notebook, name), kind, tmp_path)
    expected = {"card": {"train_window", "train_window_fp16"}, "plain": {"train_window (ddp)"},
                "sync_flag": {"train_window (flag before the forward)"}}[kind]
    assert results == dict.fromkeys(expected, "ok")


@pytest.mark.parametrize(("notebook", "name", "kind"), [CARD, PLAIN, SYNC_FLAG])
def test_a_copy_with_a_cpu_count_tensor_fails_the_guard(notebook, name, kind, tmp_path):
    program = written_program(notebook, name)
    good, bad = CPU_COUNT[kind]
    assert program.count(good) == (2 if kind == "card" else 1)  # every count tensor
    results = _guarded(program.replace(good, bad), kind, tmp_path)
    assert results and all("dist.all_reduce got a tensor on meta; the model is on cpu" in why
                           for why in results.values()), results


def test_written_program_names_a_missing_cell():
    with pytest.raises(ValueError, match="has no cell starting with"):
        written_program("00_the_article.ipynb", "no_such_program.py")
