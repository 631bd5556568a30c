"""DDP under a real torchrun (2 gloo processes): equivalence, communication, failures
(gradaccum_course/programs/ddp.py runs accumulate_window under DDP and FSDP2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradaccum_course.launch import LaunchError, LaunchTimeout, launch
from gradaccum_course.programs import ddp

DDP = "gradaccum_course.programs.ddp"
BASE = ["--accumulation-steps", "4", "--micro-batch-size", "4", "--steps", "3"]
WORKERS = Path(__file__).resolve().parent / "workers"
HANG_WORKER = str(WORKERS / "hang.py")


def _no_workers_left(error: LaunchError) -> bool:
    """Return True if no process of the failed run still runs: neither a pid launch() recorded
    (the agent and its workers) nor a descendant of this test. Other runs are not looked at."""
    import psutil

    def runs(pid: int) -> bool:  # a zombie awaiting its reaper, or a reused pid, does not
        try:
            process = psutil.Process(pid)
            return process.status() != psutil.STATUS_ZOMBIE and any(
                name in " ".join(process.cmdline())
                for name in (DDP, "hang.py", "torch.distributed.run"))
        except psutil.Error:
            return False

    assert len(error.process_ids) >= 3, error.process_ids  # the agent and both workers
    own = [process.pid for process in psutil.Process().children(recursive=True)]
    return not any(runs(pid) for pid in [*error.process_ids, *own])


@pytest.fixture(scope="module")
def window_run():
    return launch(DDP, [*BASE, "--sync", "window"], nproc_per_node=2,
                  timeout_seconds=180)


def test_ddp_with_accumulation_equals_one_large_batch(window_run):
    assert window_run["world_size"] == 2 and window_run["backend"] == "gloo"
    assert window_run["effective_batch_size"] == 4 * 4 * 2
    assert window_run["steps"] == 3
    assert window_run["max_cross_rank_difference"] == 0.0
    assert window_run["max_difference_to_single_process"] <= 1e-12


def test_sync_once_per_window_vs_every_micro_step(window_run):
    every = launch(DDP, [*BASE, "--sync", "every"], timeout_seconds=180)
    assert every["max_difference_to_single_process"] <= 1e-12
    parameter_bytes = window_run["parameter_bytes"]
    for step in window_run["per_step"]:
        assert step["syncs"] == 1 and step["bytes"] == parameter_bytes
    for step in every["per_step"]:
        assert step["syncs"] == 4 and step["bytes"] == 4 * parameter_bytes
    assert every["bytes_per_step"] / window_run["bytes_per_step"] == 4


CROSS_RANK = """\
import json, os, sys
import torch, torch.distributed as dist
from gradaccum_lib.distributed import init_distributed
from gradaccum_course.programs.ddp import cross_rank_difference
init_distributed()
model = torch.nn.Linear(3, 2, dtype=torch.float64)
torch.nn.init.constant_(model.weight, 1.0)
torch.nn.init.constant_(model.bias, 0.0)
same = cross_rank_difference(model)
with torch.no_grad():
    model.bias[1] += 0.25 * dist.get_rank()  # rank r is off rank 0 by 0.25 r in one entry
apart = cross_rank_difference(model)
if dist.get_rank() == 0:
    with open(sys.argv[-1], "w") as handle:
        json.dump({"same": same, "apart": apart}, handle)
dist.destroy_process_group()
os._exit(0)
"""


def test_cross_rank_difference_is_the_largest_gap_to_rank_0_over_all_ranks(tmp_path):
    # the DDP program checks every step with it: 0.0 only when every rank holds rank 0's
    import torch

    assert ddp.cross_rank_difference(torch.nn.Linear(2, 2)) == 0.0  # one process, no group
    script = tmp_path / "cross_rank.py"
    script.write_text(CROSS_RANK)
    result = launch(str(script), [], nproc_per_node=3, timeout_seconds=180)
    assert result == {"same": 0.0, "apart": 0.5}  # rank 2's bias entry, 2 x 0.25


def _faulty(tmp_path, *fault: str) -> list[str]:
    """Arguments for the test worker tests/workers/hang.py (the fault hooks live there, not in
    the teaching programs)."""
    return ["--ready-dir", str(tmp_path), "--json", str(tmp_path / "out.json"),
            "--process-group", *fault]


def test_a_failing_rank_raises_with_its_message_and_leaves_no_process(tmp_path):
    with pytest.raises(LaunchError, match="deliberate failure on rank 1") as info:
        launch(HANG_WORKER, _faulty(tmp_path, "--fail-ranks", "1"), timeout_seconds=120)
    assert info.value.root_cause_rank == 1
    assert "deliberate failure on rank 1" in info.value.rank_stderr[1]
    assert _no_workers_left(info.value)


def test_a_hanging_launch_is_killed_at_the_timeout(tmp_path):
    with pytest.raises(LaunchTimeout, match="did not finish within 12 s") as info:
        launch(HANG_WORKER, _faulty(tmp_path, "--hang-ranks", "0"), timeout_seconds=12)
    assert _no_workers_left(info.value)


def test_launch_rejects_bad_arguments():
    with pytest.raises(ValueError, match="nproc_per_node must be a positive int; got 0"):
        launch(DDP, BASE, nproc_per_node=0)
    with pytest.raises(ValueError, match="timeout_seconds must be > 0"):
        launch(DDP, BASE, timeout_seconds=0)


def test_program_falls_back_to_one_process_without_torchrun(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    output = tmp_path / "single.json"
    assert ddp.main([*BASE, "--json", str(output), "--steps-per-epoch", "2"]) == 0
    results = json.loads(output.read_text())
    assert results["world_size"] == 1 and results["backend"] is None
    assert results["effective_batch_size"] == 16
    assert results["max_difference_to_single_process"] <= 1e-12
    assert results["per_step"][0]["syncs"] == 0


def test_program_rejects_bad_command_lines(capsys):
    with pytest.raises(SystemExit):
        ddp.parse_arguments(["--accumulation-steps", "0", "--micro-batch-size", "2",
                             "--steps", "1", "--json", "x"])
    assert "--accumulation-steps must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ddp.parse_arguments([*BASE, "--json", "x", "--sync", "sometimes"])
    with pytest.raises(SystemExit):  # the traps are programs in notebook 05, not options
        ddp.parse_arguments([*BASE, "--json", "x", "--trap", "sync-after-forward"])
    assert "unrecognized arguments: --trap" in capsys.readouterr().err


# The loop under DDP and FSDP2: one global window of 8 sequences (micro-batch 2) run as
# k = 4 x 1 process, k = 2 x 2 processes, k = 1 x 4 processes and FSDP2 k = 2 x 2; a token
# loss over sequences of 1..24 real tokens (uneven counts across micro-batches AND ranks),
# 28 samples (3 full windows + a partial one of 4 sequences), 2 epochs, AdamW, float64.
THREE_WAY = ["--task", "tokens", "--micro-batch-size", "2", "--samples", "28", "--steps", "8",
             "--steps-per-epoch", "4", "--optimizer", "adamw", "--lr", "0.01",
             "--dump-parameters"]


@pytest.fixture(scope="module")
def three_way_runs():
    runs = {}
    for steps, processes, wrap in ((4, 1, "ddp"), (2, 2, "ddp"), (1, 4, "ddp"), (2, 2, "fsdp2")):
        runs[steps, processes, wrap] = launch(
            DDP, ["--accumulation-steps", str(steps), "--wrap", wrap, *THREE_WAY],
            nproc_per_node=processes, timeout_seconds=300)
    return runs


def test_the_loop_gives_the_same_parameters_for_any_split_of_the_global_window(three_way_runs):
    reference = three_way_runs[4, 1, "ddp"]
    assert reference["history"]["items"][3] < reference["history"]["items"][0]  # partial window
    for key, run in three_way_runs.items():
        assert run["steps"] == 8, key
        assert run["world_size"] == key[1] and run["wrap"] == key[2]
        # the GLOBAL window's items and loss, identical on every rank and in every split
        assert run["history"]["items"] == reference["history"]["items"], key
        assert run["max_cross_rank_difference"] == 0.0, key
        assert run["max_difference_to_single_process"] <= 1e-12, key
        difference = max(abs(a - b) for a, b in zip(run["final_parameters"],
                                                     reference["final_parameters"], strict=True))
        assert difference <= 1e-12, (key, difference)


def test_the_loop_refuses_a_plain_model_under_a_process_group(tmp_path):
    # the loop on an UNWRAPPED model with 2 ranks would never sync: refused, not drifting
    script = tmp_path / "plain.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "from gradaccum_lib.accumulation import accumulate_window\n"
        "from gradaccum_lib.losses import sample_classification_loss\n"
        "dist.init_process_group('gloo')\n"
        "model = torch.nn.Linear(2, 2)\n"
        "window = [(torch.ones(2, 2), torch.tensor([0, 1]))]\n"
        "try:\n"
        "    accumulate_window(model, torch.optim.SGD(model.parameters(), lr=0.1), window,\n"
        "                      sample_classification_loss)\n"
        "except ValueError as error:\n"
        "    print('REFUSED', error)\n"
        "dist.destroy_process_group()\n")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(script)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("REFUSED") == 2
    assert "wrap it in DistributedDataParallel" in result.stdout


def test_fsdp2_checkpoints_gather_the_shards_and_resume_exactly():
    worker = str(Path(__file__).resolve().parent / "workers" / "fsdp_resume.py")
    result = launch(worker, [], nproc_per_node=2, timeout_seconds=180)
    assert result["optimizer_steps"] == 4
    assert result["resumed"] == result["straight"]  # bit for bit, after the resume


def _largest_difference(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_a_users_comm_hook_stays_in_place_and_the_loop_stays_exact_beside_it():
    result = launch(str(WORKERS / "user_hooks.py"), [], nproc_per_node=2, timeout_seconds=180)
    reference = result["reference"]
    for how in ("no hook", "counter", "PowerSGD", "bucket view", "PowerSGD, bucket view"):
        run = result[how]
        assert run["items"] == [32.0, 32.0, 32.0]  # 12 + 20: the global count, not 2 x 12
        assert _largest_difference(run["parameters"], reference) <= 1e-12, how

    # the loop's own collective: one small all-reduce a window (the totals); DDP's built-in C++
    # hook is not seen here, a Python hook's all-reduce of the gradient's one bucket is
    for how in ("no hook", "bucket view"):
        assert result[how]["all_reduces_per_window"] == [1, 1, 1], how
    for how in ("counter", "fp16 compress", "PowerSGD", "PowerSGD, bucket view"):
        assert result[how]["all_reduces_per_window"] == [2, 2, 2], how
    # the user's counting hook ran once per window: one synchronising backward pass
    assert result["counter"]["hook_syncs_per_window"] == [1, 1, 1]
    # fp16 compression, the user's choice, rounds the gradient; the loop adds nothing to it
    assert _largest_difference(result["fp16 compress"]["parameters"], reference) < 1e-3
    assert result["fp16 compress"]["items"] == [32.0, 32.0, 32.0]
    # the loop took no slot: free without a user hook, the user's hook still there otherwise
    assert result["no hook"]["slot_after"] == "free"
    assert result["bucket view"]["slot_after"] == "free"
    for how in ("counter", "fp16 compress", "PowerSGD", "PowerSGD, bucket view"):
        assert result[how]["slot_after"].startswith("taken"), result[how]["slot_after"]
    # a NaN on rank 1: both ranks raise (rank 1 names its micro-batch), no step anywhere
    nan = result["nan"]
    assert "another rank" in nan["raised"][0] and "micro-batch 1" in nan["raised"][1]
    assert not nan["stepped"]


def test_the_sync_helper_skips_ddps_sync_and_sets_fsdp2s_flag(tmp_path):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from gradaccum_lib.accumulation import _gradient_sync
    from gradaccum_lib.measure.comm import CommCounter

    class Fsdp2Like(torch.nn.Linear):  # what the helper looks for on an FSDP2 module
        def set_requires_gradient_sync(self, requires: bool) -> None:
            self.requires = requires

    sharded = Fsdp2Like(2, 2)
    for sync in (False, True):
        with _gradient_sync(sharded, sync):
            assert sharded.requires is sync
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = DistributedDataParallel(torch.nn.Linear(2, 2))
        counter = CommCounter()
        counter.register(model)
        assert counter.group is model.process_group  # it averages over the model's group
        for sync in (False, True):  # the flag is set before the forward, as the loop does
            with _gradient_sync(model, sync):
                model(torch.ones(1, 2)).sum().backward()
            assert counter.take()["syncs"] == int(sync)
        assert model.require_backward_grad_sync is True  # no_sync() restored it
    finally:
        dist.destroy_process_group()
