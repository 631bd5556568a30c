"""The job's checkpoints: an exact resume in one process, files that refuse to be wrong, and the
one check of a checkpoint's state against the run, made before anything is restored."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from gradaccum_lib.distributed import init_distributed
from recipes.emr_classification import train
from recipes.emr_classification.checkpoints import (
    _MAGIC,
    CheckpointError,
    read_checkpoint,
    remove_stale_temporaries,
    write_checkpoint,
)

# 96 notes of 32 tokens, micro-batch 4, k = 2: 12 windows per epoch, 2 epochs, float64, dropout
# 0.1 (the generators matter mid-epoch too)
JOB = ["--train-samples", "96", "--validation-samples", "30", "--max-length", "32",
       "--micro-batch-size", "4", "--accumulation-steps", "2", "--epochs", "2", "--dtype",
       "float64", "--warmup-steps", "2", "--lr", "5e-4", "--no-progress"]


class _Killed(Exception):
    """The process 'dies' here: nothing after this window runs, the files stay as they are."""


def _killed_after(windows: int, directory: Path) -> Path:
    """Run the job with a checkpoint every 3 windows and stop it dead in window ``windows`` +
    1, as a SIGKILL would; return its folder."""
    calls, real = itertools.count(1), train.accumulate_window

    def dying(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if next(calls) > windows:
            raise _Killed
        return real(*args, **kwargs)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train, "accumulate_window", dying)
        with pytest.raises(_Killed):
            train.main([*JOB, "--checkpoint-dir", str(directory), "--checkpoint-every", "3"])
    return directory


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    directory = tmp_path_factory.mktemp("straight")
    assert train.main([*JOB, "--checkpoint-dir", str(directory), "--json",
                       str(directory / "log.json")]) == 0
    return directory


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A run killed in window 5 of epoch 0: its checkpoint holds 3 windows."""
    return _killed_after(5, tmp_path_factory.mktemp("killed"))


def _final(directory: Path) -> dict:
    return torch.load(directory / "final.pt", weights_only=True)


def test_a_run_killed_mid_epoch_resumes_bit_for_bit(straight, killed, tmp_path):
    shutil.copytree(killed, tmp_path, dirs_exist_ok=True)
    torch.manual_seed(12345)  # a new process's generator is anywhere
    assert train.main([*JOB, "--checkpoint-dir", str(tmp_path), "--resume", "--json",
                       str(tmp_path / "log.json")]) == 0
    log, reference = (json.loads((d / "log.json").read_text()) for d in (tmp_path, straight))
    assert log["resumed_from"] == {"epoch": 0, "window": 3, "optimizer_steps": 3}
    assert log["steps"] == reference["steps"] and log["epochs"] == reference["epochs"]
    final, expected = _final(tmp_path), _final(straight)
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[key], expected[key]) for key in final)


def _resume_crafted(killed: Path, tmp_path: Path, change, flags=()):  # noqa: ANN001
    """Resume a built job from the killed run's checkpoint with ``change(state)`` applied (its
    hash valid); return the refusal and whether the job was left as it was built."""
    shutil.copytree(killed, tmp_path, dirs_exist_ok=True)
    state = read_checkpoint(tmp_path / "checkpoint.pt")
    change(state)
    write_checkpoint(state, tmp_path / "checkpoint.pt")
    arguments = train.parse_arguments([*JOB, *flags, "--checkpoint-dir", str(tmp_path),
                                       "--resume"])
    job, _ = train._build(arguments, init_distributed())
    before = ([p.detach().clone() for p in job.base.parameters()], torch.get_rng_state())
    with pytest.raises(CheckpointError) as info:
        train._resume(job)
    untouched = (all(torch.equal(a, b) for a, b in zip(before[0], job.base.parameters(),
                                                       strict=True))
                 and torch.equal(before[1], torch.get_rng_state()) and not job.optimizer.state
                 and job.scheduler.last_epoch == 0 and not job.history
                 and (job.epoch, job.windows_done, job.optimizer_steps) == (0, 0, 0))
    return str(info.value), untouched


def _set(key, value):  # noqa: ANN001, ANN202
    return lambda state: state.update({key: value})


@pytest.mark.parametrize(("change", "message", "flags"), [
    # values against the run (issue 36): each loaded and then failed or misled before
    (_set("windows_done", 1000), r"windows_done: 1000, but an epoch of this run has 12 windows",
     ()),
    (_set("window_fingerprint", "0" * 64), r"window_fingerprint: '00000.*the data differ", ()),
    (_set("epoch", 7), r"history: 3 windows, but epoch 7 and windows_done 3 say 87", ()),
    (_set("optimizer_steps", 999), r"optimizer_steps: 999, but the checkpoint trained 3 windows "
                                   r"\(epoch 0, window 3\) and its schedule took 3 steps", ()),
    (lambda state: state["history"].pop(), r"history: 2 windows, but .* say 3", ()),
    (_set("run", {}), r"--lr: checkpoint None, this run 0\.0005", ()),
    (_set("format", 3), r"format 3; this version reads format 4", ()),
    # types, dtypes and shapes against the live state_dicts
    (_set("scheduler", {"bogus": 1}), r"scheduler: keys \[.*'last_epoch'.*\] missing, "
                                      r"\['bogus'\] unknown", ()),
    (lambda state: state["model"].update({key: value.float() for key, value in
                                          state["model"].items() if value.is_floating_point()}),
     r"model\['.*'\]: dtype torch\.float32, this run's torch\.float64", ()),
    (lambda state: state["optimizer"]["state"][1].update(
        exp_avg=state["optimizer"]["state"][1]["exp_avg"].float()),
     r"optimizer: exp_avg of parameter 1 has dtype torch\.float32, the parameter torch\.float64",
     ()),
    (lambda state: state["optimizer"]["state"][0].update(exp_avg=torch.zeros(99)),
     r"optimizer: exp_avg of parameter 0 has shape \(99,\), the parameter \(\d+, \d+\)", ()),
    (lambda state: state["optimizer"]["param_groups"][0].update(betas="fast"),
     r"optimizer\['param_groups'\]\[0\]\['betas'\]: a str, this run's a tuple", ()),
    (lambda state: state["scheduler"].update(last_epoch="2"),
     r"scheduler\['last_epoch'\]: a str, this run's an int", ()),
    (lambda state: state["ranks"][0].update(cpu_rng_state=torch.zeros(10, dtype=torch.uint8)),
     r"ranks\[0\]\['cpu_rng_state'\]: shape \(10,\), this run's \(\d+,\)", ()),
    (_set("ranks", []), r"ranks: 0 entries, this run's 1", ()),
], ids=["windows-done-1000", "fingerprint-zeroed", "epoch-7", "optimizer-steps-999",
        "history-short", "run-flags-gone", "old-format", "scheduler-bogus",
        "model-float32-for-float64", "optimizer-float32-state", "optimizer-state-shape",
        "optimizer-betas-str", "scheduler-last-epoch-str", "rank-generator-state-short",
        "ranks-missing"])
def test_a_crafted_checkpoint_is_refused_with_one_error_before_anything_is_restored(
        killed, tmp_path, change, message, flags):
    error, untouched = _resume_crafted(killed, tmp_path, change, flags)
    assert re.search(message, error), error
    assert error.startswith(f"--resume: checkpoint {tmp_path / 'checkpoint.pt'} does not fit "
                            "this run; nothing was restored: ") and "\n" not in error
    assert untouched


def test_an_epoch_1_checkpoint_resumed_with_epochs_1_is_refused_naming_the_flag(tmp_path,
                                                                                capsys):
    directory = _killed_after(12 + 5, tmp_path)  # 3 windows into epoch 1
    before = (directory / "checkpoint.pt").read_bytes()
    assert train.main([*JOB, "--epochs", "1", "--checkpoint-dir", str(directory),
                       "--resume"]) == 2
    assert capsys.readouterr().err == (
        f"error: --resume: checkpoint {directory / 'checkpoint.pt'} does not fit this run; "
        "nothing was restored: --epochs 1: the checkpoint has trained past it (epoch 1, 3 of "
        "its 12 windows done); resume with --epochs 2 or more\n")
    assert not (directory / "final.pt").exists()  # no partial model passed off as the result
    assert (directory / "checkpoint.pt").read_bytes() == before


def test_state_problems_name_each_field_of_another_kind():
    live = {"w": torch.zeros(2), "lrs": [0.1, 0.2], "step": 3, "flag": False, "none": None}
    assert train._state_problems(dict(live), live, "part") == []
    assert train._state_problems({**live, "step": 3.0}, live, "part") == []  # numbers are numbers
    saved = {"w": torch.zeros(2, dtype=torch.float64), "lrs": [0.1], "step": "3", "flag": 1,
             "none": None}
    assert train._state_problems(saved, live, "part") == [
        "part['w']: dtype torch.float64, this run's torch.float32",
        "part['lrs']: 1 entries, this run's 2",
        "part['step']: a str, this run's an int",
        "part['flag']: an int, this run's a bool"]
    assert train._state_problems({"w": torch.zeros(3)}, {"w": torch.zeros(2)}, "m") == [
        "m['w']: shape (3,), this run's (2,)"]
    assert train._state_problems(5, {}, "scheduler") == ["scheduler: an int, this run's a dict"]


# The files: atomic, hashed, their temporaries swept. -------------------------------------------

@pytest.fixture
def checkpoint(tmp_path):
    return write_checkpoint({"a": torch.arange(300), "b": [1.5, "x"]}, tmp_path / "c.pt")


def test_a_flipped_bit_in_the_tensor_data_is_refused_naming_the_path(checkpoint):
    data = bytearray(checkpoint.read_bytes())
    data[len(data) // 2] ^= 0x01
    checkpoint.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"checkpoint {checkpoint} is corrupted"):
        read_checkpoint(checkpoint)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda data: b"", "is empty"),
    (lambda data: data[: len(data) // 3], "is corrupted or truncated"),
    (lambda data: b"PK\x03\x04 not ours" * 40, "is not a gradaccum checkpoint"),
])
def test_unreadable_checkpoints_are_refused_naming_the_path(checkpoint, damage, message):
    checkpoint.write_bytes(damage(checkpoint.read_bytes()))
    with pytest.raises(CheckpointError, match=f"{checkpoint} {message}"):
        read_checkpoint(checkpoint)


def test_a_missing_checkpoint_names_its_path(tmp_path):
    with pytest.raises(CheckpointError, match=f"checkpoint {tmp_path / 'none.pt'} does not"):
        read_checkpoint(tmp_path / "none.pt")


def test_writes_are_atomic_and_clean_stale_temporaries(tmp_path):
    target = tmp_path / "c.pt"
    stale = tmp_path / f".c.pt.tmp-{2**22 + 12345}"  # above the default pid_max: no process
    stale.write_bytes(b"left by a crash")
    write_checkpoint({"a": torch.arange(3)}, target)
    assert not stale.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]
    assert torch.equal(read_checkpoint(target)["a"], torch.arange(3))
    with pytest.raises(CheckpointError, match="is a folder, not a file"):
        write_checkpoint({}, tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        write_checkpoint({}, tmp_path / "missing" / "c.pt")


def test_only_temporaries_whose_writer_is_gone_are_removed(checkpoint):
    dead, alive = 2**22 + 12345, os.getpid()  # above Linux's default pid_max: no such process
    stale = checkpoint.parent / f".{checkpoint.name}.tmp-{dead}"
    live = checkpoint.parent / f".{checkpoint.name}.tmp-{alive}"
    for temporary in (stale, live):
        temporary.write_bytes(b"x" * 1000)
    assert remove_stale_temporaries(checkpoint) == [stale]
    assert not stale.exists() and live.exists()  # a live writer's file is kept


def test_a_payload_that_is_not_a_torch_save_names_the_path_and_what_was_expected(tmp_path):
    payload = b"not a pickle at all"
    path = tmp_path / "foreign.pt"
    path.write_bytes(_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    with pytest.raises(CheckpointError, match=r"foreign\.pt cannot be unpickled \(expected a "
                                              r"dict of tensors and plain data"):
        read_checkpoint(path)
