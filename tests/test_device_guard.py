"""The device rule for the loop: every tensor ``accumulate_window`` builds for a collective lives
on the model's device, so the same call runs under gloo on a CPU and under nccl on GPUs.

On a CPU-only machine the model's device and the default device are both the CPU, so a plain
run cannot tell ``torch.as_tensor(n)`` from ``torch.as_tensor(n, device=model_device)``; under
nccl the first raises "No backend type associated with device type cpu". The guard makes them
differ: it runs the loop on a CPU model while the DEFAULT device is ``meta``, with every
collective checking that its tensor lives on the model's device (one process, a world-size-1
gloo group). What it does not catch: a backend chosen wrongly or a tensor on the wrong GPU
index; ``make gpu-check`` proves those on a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
LOOP = ROOT / "gradaccum_lib" / "accumulation.py"
COUNT = "torch.full((), items, **placement)"

GUARD = """\
import importlib.util, json, sys
import torch, torch.distributed as dist
from torch.nn.functional import cross_entropy
from torch.nn.parallel import DistributedDataParallel
from gradaccum_lib.workloads.models import make_mlp

source, out = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("gradaccum_lib.guarded_copy", source)
loop = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # as `source` has it
spec.loader.exec_module(loop)
dist.init_process_group("gloo", store=dist.FileStore(out + ".store", 1), rank=0, world_size=1)
calls = []
for name in ("all_reduce", "broadcast", "all_gather", "reduce_scatter_tensor", "reduce"):
    def checked(tensor, *args, _real=getattr(dist, name), _name=name, **kwargs):
        calls.append(_name)
        if tensor.device != torch.device("cpu"):  # the model's device
            raise RuntimeError(f"dist.{_name} got a tensor on {tensor.device}; the model is on cpu")
        work = _real(tensor, *args, **kwargs)
        if _name == "all_reduce" and tensor.dtype == torch.int64:  # the ranks' micro-batch
            tensor[1] = tensor[0]  # counts: the told-of rank 1 has as many as this rank
        return work
    setattr(dist, name, checked)
model = DistributedDataParallel(make_mlp(16, 32, 4, seed=1, dtype=torch.float32))
# the loop skips its collective for one rank: told of two, it makes it (on the 1-rank group)
dist.get_world_size = lambda group=None: 2
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
window = [(torch.randn(10, 16), torch.randint(0, 4, (10,))),
          (torch.randn(3, 16), torch.randint(0, 4, (3,)))]
torch.set_default_device("meta")  # a tensor made without device= lands here
try:
    loop.accumulate_window(model, optimizer, window,  # an int count: built by the loop
                           lambda m, b: (cross_entropy(m(b[0]), b[1], reduction="sum"), len(b[1])))
    result = "ok" if "all_reduce" in calls else "the loop called no collective"
except RuntimeError as error:
    result = str(error)
torch.set_default_device(None)
dist.destroy_process_group()
with open(out, "w") as handle:
    json.dump(result, handle)
"""


def _guarded(source: str, folder: Path) -> str:
    loop, guard, out = folder / "loop.py", folder / "guard.py", folder / "out.json"
    loop.write_text(source)
    guard.write_text(GUARD)
    done = subprocess.run([sys.executable, str(guard), str(loop), str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


def test_the_loop_hands_collectives_tensors_on_the_models_device(tmp_path):
    assert _guarded(LOOP.read_text(), tmp_path) == "ok"


def test_a_copy_with_its_count_tensor_on_the_default_device_fails_the_guard(tmp_path):
    source = LOOP.read_text()
    assert source.count(COUNT) == 1  # the one count tensor the loop builds from numbers
    result = _guarded(source.replace(COUNT, COUNT.replace("**placement", "dtype=torch.float64")),
                      tmp_path)
    assert result != "ok" and "meta" in result, result


def test_the_totals_follow_the_backend_not_the_parameters(monkeypatch):
    """Under nccl the window's totals go to the current CUDA device even when the parameters
    sit on the CPU (FSDP2's CPU offload); on MPS they are float32 (it has no float64). Neither
    device is here: the placement is read, no tensor is made."""
    from gradaccum_lib import accumulation

    cpu = torch.device("cpu")
    assert accumulation._totals_placement(cpu, None, 1) == {"dtype": torch.float64,
                                                             "device": torch.device("cpu")}
    monkeypatch.setattr(accumulation.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(accumulation.torch.cuda, "current_device", lambda: 3)
    assert accumulation._totals_placement(cpu, None, 2)["device"] == torch.device("cuda", 3)
    assert accumulation._totals_placement(cpu, None, 1)["device"] == torch.device("cpu")
    monkeypatch.setattr(accumulation.dist, "get_backend", lambda group=None: "gloo")
    assert accumulation._totals_placement(cpu, None, 2)["device"] == torch.device("cpu")
    assert accumulation._totals_placement(torch.device("mps"), None, 1) == {
        "dtype": torch.float32, "device": torch.device("mps")}
