"""Exact resume with the loaders people use, and checkpoint files that refuse to be wrong."""

from __future__ import annotations

import os
import re

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from gradaccum_lib.accumulation import AccumulationTrainer
from gradaccum_lib.jobs.checkpoints import (
    CheckpointError,
    optimizer_state_problems,
    read_checkpoint,
    remove_stale_temporaries,
    state_problems,
    write_checkpoint,
)
from gradaccum_lib.jobs.resume import Resumable
from gradaccum_lib.losses import sample_classification_loss
from gradaccum_lib.workloads.data import make_toy_classification
from gradaccum_lib.workloads.models import make_mlp

DATASET = TensorDataset(*make_toy_classification(100, 8, 3, seed=4))  # 6 windows of 16 + 4


def _trainer():
    model = make_mlp(8, 16, 3, dropout=0.3, seed=0)  # dropout: the RNG matters mid-epoch too
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    return AccumulationTrainer(model, sample_classification_loss, optimizer,
                               accumulation_steps=4, scheduler=scheduler, max_grad_norm=1.0,
                               progress=False)


def _equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters(),
                                                 strict=True))


def _run(make_loader, tmp_path, *, before_resume=lambda loader: None):
    """(uninterrupted, resumed) trainers after 2 epochs; the resumed one is killed after 3
    windows of epoch 0 and restarted as a fresh process would be (other global RNG state)."""
    torch.manual_seed(7)
    uninterrupted = _trainer()
    loader = make_loader()
    for epoch in range(2):
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        uninterrupted.train_epoch(loader)

    torch.manual_seed(7)
    killed = _trainer()
    loader = make_loader()
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(0)
    Resumable(killed).train_epoch(loader, max_windows=3, checkpoint_path=tmp_path / "c.pt",
                                  checkpoint_every=3)
    torch.manual_seed(12345)  # the new process's generator is anywhere
    resumed = _trainer()
    resumable = Resumable(resumed)
    resumable.load_checkpoint(tmp_path / "c.pt")
    loader = make_loader()
    before_resume(loader)
    for epoch in range(resumed.epoch, 2):
        if hasattr(loader.sampler, "set_epoch") and epoch > 0:
            loader.sampler.set_epoch(epoch)
        resumable.train_epoch(loader)
    return uninterrupted, resumed


def test_resume_with_a_shuffling_dataloader_is_exact(tmp_path):
    uninterrupted, resumed = _run(lambda: DataLoader(DATASET, batch_size=4, shuffle=True),
                                  tmp_path)
    assert _equal(uninterrupted, resumed)
    assert resumed.history == uninterrupted.history


def test_resume_with_a_seeded_loader_generator_is_exact(tmp_path):
    def make_loader():
        return DataLoader(DATASET, batch_size=4, shuffle=True,
                          generator=torch.Generator().manual_seed(3))
    uninterrupted, resumed = _run(make_loader, tmp_path)
    assert _equal(uninterrupted, resumed)


def _distributed_loader():
    sampler = DistributedSampler(DATASET, num_replicas=1, rank=0, shuffle=True, seed=5)
    sampler.set_epoch(0)
    return DataLoader(DATASET, batch_size=4, sampler=sampler)


def test_resume_with_a_distributed_sampler_is_exact(tmp_path):
    uninterrupted, resumed = _run(_distributed_loader, tmp_path)
    assert _equal(uninterrupted, resumed)


def test_resume_with_a_sampler_at_the_wrong_epoch_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"sampler is at epoch 1 .* call sampler.set_epoch\(0\)"):
        _run(_distributed_loader, tmp_path,
             before_resume=lambda loader: loader.sampler.set_epoch(1))


def test_resume_on_other_samples_is_refused_not_trained(tmp_path):
    torch.manual_seed(7)
    killed = _trainer()
    Resumable(killed).train_epoch(DataLoader(DATASET, batch_size=4, shuffle=False),
                                  max_windows=3, checkpoint_path=tmp_path / "c.pt",
                                  checkpoint_every=3)
    resumed = _trainer()
    resumable = Resumable(resumed)
    resumable.load_checkpoint(tmp_path / "c.pt")
    before = [p.detach().clone() for p in resumed.model.parameters()]
    reversed_data = TensorDataset(*(t.flip(0) for t in DATASET.tensors))
    with pytest.raises(ValueError, match="do not replay the interrupted run: window 2 differs"):
        resumable.train_epoch(DataLoader(reversed_data, batch_size=4, shuffle=False))
    assert all(torch.equal(a, b) for a, b in zip(before, resumed.model.parameters(),
                                                 strict=True))


def test_resume_with_fewer_windows_than_trained_is_refused(tmp_path):
    killed = _trainer()
    Resumable(killed).train_epoch(DataLoader(DATASET, batch_size=4), max_windows=6,
                                  checkpoint_path=tmp_path / "c.pt", checkpoint_every=6)
    resumable = Resumable(_trainer())
    resumable.load_checkpoint(tmp_path / "c.pt")
    short = TensorDataset(*(t[:40] for t in DATASET.tensors))
    with pytest.raises(ValueError, match="hold 3 windows but the checkpoint had already"):
        resumable.train_epoch(DataLoader(short, batch_size=4))


@pytest.fixture
def checkpoint(tmp_path):
    trainer = _trainer()
    trainer.train_epoch(DataLoader(DATASET, batch_size=4), max_windows=2)
    path = tmp_path / "c.pt"
    Resumable(trainer).save_checkpoint(path)
    return path


def test_a_flipped_bit_in_the_tensor_data_is_refused_naming_the_path(checkpoint):
    data = bytearray(checkpoint.read_bytes())
    data[len(data) // 2] ^= 0x01
    checkpoint.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"checkpoint {checkpoint} is corrupted"):
        Resumable(_trainer()).load_checkpoint(checkpoint)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda data: b"", "is empty"),
    (lambda data: data[: len(data) // 3], "is corrupted or truncated"),
    (lambda data: b"PK\x03\x04 not ours" * 40, "is not a gradaccum checkpoint"),
])
def test_unreadable_checkpoints_are_refused_naming_the_path(checkpoint, damage, message):
    checkpoint.write_bytes(damage(checkpoint.read_bytes()))
    with pytest.raises(CheckpointError, match=f"{checkpoint} {message}"):
        Resumable(_trainer()).load_checkpoint(checkpoint)


def test_a_missing_checkpoint_names_its_path(tmp_path):
    with pytest.raises(CheckpointError, match=f"checkpoint {tmp_path / 'none.pt'} does not"):
        Resumable(_trainer()).load_checkpoint(tmp_path / "none.pt")


def test_a_checkpoint_of_another_optimizer_is_refused_before_anything_is_restored(checkpoint):
    model = make_mlp(8, 16, 3, dropout=0.3, seed=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = AccumulationTrainer(
        model, sample_classification_loss, optimizer, accumulation_steps=4, progress=False,
        scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=3))
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(CheckpointError, match="optimizer_kind: checkpoint 'AdamW', trainer 'SGD'"):
        Resumable(trainer).load_checkpoint(checkpoint)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert trainer.optimizer_steps == 0 and not optimizer.state


def test_a_checkpoint_of_another_model_or_k_names_the_mismatch(checkpoint):
    wider = make_mlp(8, 32, 3, seed=0)
    trainer = AccumulationTrainer(wider, sample_classification_loss,
                                  torch.optim.AdamW(wider.parameters()), accumulation_steps=2,
                                  progress=False)
    with pytest.raises(CheckpointError) as info:
        Resumable(trainer).load_checkpoint(checkpoint)
    assert "accumulation_steps: checkpoint 4, trainer 2" in str(info.value)
    assert "model: another architecture" in str(info.value)


def test_writes_are_atomic_and_clean_stale_temporaries(tmp_path):
    target = tmp_path / "c.pt"
    stale = tmp_path / f".c.pt.tmp-{2**22 + 12345}"  # above the default pid_max: no process
    stale.write_bytes(b"left by a crash")
    write_checkpoint({"a": torch.arange(3)}, target)
    assert not stale.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]
    assert torch.equal(read_checkpoint(target)["a"], torch.arange(3))
    with pytest.raises(CheckpointError, match="is a directory"):
        write_checkpoint({}, tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        write_checkpoint({}, tmp_path / "missing" / "c.pt")


def test_resume_removes_temporaries_whose_writer_is_gone(checkpoint):
    dead, alive = 2**22 + 12345, os.getpid()  # above Linux's default pid_max: no such process
    stale = checkpoint.parent / f".{checkpoint.name}.tmp-{dead}"
    live = checkpoint.parent / f".{checkpoint.name}.tmp-{alive}"
    for temporary in (stale, live):
        temporary.write_bytes(b"x" * 1000)
    assert remove_stale_temporaries(checkpoint) == [stale]
    stale.write_bytes(b"x")
    Resumable(_trainer()).load_checkpoint(checkpoint)  # a resume clears them too
    assert not stale.exists() and live.exists()  # a live writer's file is kept


def test_optimizer_state_of_other_shapes_is_refused_before_anything_is_restored(checkpoint,
                                                                                  tmp_path):
    state = read_checkpoint(checkpoint)
    state["optimizer"]["state"][0]["exp_avg"] = torch.zeros(99)
    damaged = write_checkpoint(state, tmp_path / "damaged.pt")
    trainer = _trainer()
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(CheckpointError, match=r"damaged\.pt: .*optimizer: exp_avg of parameter "
                                              r"0 has shape \(99,\), the parameter \(16, 8\)"):
        Resumable(trainer).load_checkpoint(damaged)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(),
                                                 strict=True))
    assert optimizer_state_problems(read_checkpoint(checkpoint)["optimizer"],
                                    trainer.optimizer) == []


def test_a_payload_that_is_not_a_torch_save_names_the_path_and_what_was_expected(tmp_path):
    import hashlib

    from gradaccum_lib.jobs.checkpoints import _MAGIC

    payload = b"not a pickle at all"
    path = tmp_path / "foreign.pt"
    path.write_bytes(_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    with pytest.raises(CheckpointError, match=r"foreign\.pt cannot be unpickled \(expected a "
                                              r"dict of tensors and plain data"):
        read_checkpoint(path)


def _load_crafted(checkpoint, tmp_path, change):
    """Load the checkpoint with ``change(state)`` applied (hash valid) into a fresh trainer;
    return the raised CheckpointError and whether the trainer was left as it was."""
    state = read_checkpoint(checkpoint)
    change(state)
    crafted = write_checkpoint(state, tmp_path / "crafted.pt")
    trainer = _trainer()
    before = ([p.detach().clone() for p in trainer.model.parameters()],
              trainer.scheduler.state_dict())
    with pytest.raises(CheckpointError) as info:
        Resumable(trainer).load_checkpoint(crafted)
    untouched = (all(torch.equal(a, b) for a, b in zip(before[0], trainer.model.parameters(),
                                                       strict=True))
                 and not trainer.optimizer.state and trainer.optimizer_steps == 0
                 and trainer.scheduler.state_dict() == before[1])
    return str(info.value), untouched


@pytest.mark.parametrize(("change", "message"), [
    (lambda state: state.update(scheduler={"bogus": 1}),
     r"scheduler: keys \[.*'last_epoch'.*\] missing, \['bogus'\] unknown"),
    (lambda state: state["model"].update({"0.weight": state["model"]["0.weight"].float()}),
     r"model\['0\.weight'\]: dtype torch\.float32, this run's torch\.float64"),
    (lambda state: state["optimizer"]["state"][1].update(
        exp_avg=state["optimizer"]["state"][1]["exp_avg"].float()),
     r"optimizer: exp_avg of parameter 1 has dtype torch\.float32, the parameter torch\.float64"),
    (lambda state: state["optimizer"]["param_groups"][0].update(betas="fast"),
     r"optimizer\['param_groups'\]\[0\]\['betas'\]: a str, this run's a tuple"),
    (lambda state: state["scheduler"].update(last_epoch="2"),
     r"scheduler\['last_epoch'\]: a str, this run's an int"),
    (lambda state: state["ranks"][0].update(sampler_epoch="0"),
     r"ranks: rank 0's sampler_epoch is '0', not an int or None"),
    (lambda state: state["ranks"][0].update(cpu_rng_state=torch.zeros(10, dtype=torch.uint8)),
     r"ranks: rank 0's cpu_rng_state is not this torch's CPU generator state \(a uint8 tensor "
     r"of \d+\)"),
], ids=["scheduler-bogus", "model-float32-for-float64", "optimizer-float32-state",
        "optimizer-betas-str", "scheduler-last-epoch-str", "rank-sampler-epoch-str",
        "rank-generator-state-short"])
def test_a_crafted_state_of_another_type_or_dtype_is_refused_before_anything_is_restored(
        checkpoint, tmp_path, change, message):
    error, untouched = _load_crafted(checkpoint, tmp_path, change)
    assert re.search(message, error), error
    assert "nothing was restored" in error and untouched


def test_state_problems_name_each_field_of_another_kind():
    live = {"w": torch.zeros(2), "lrs": [0.1, 0.2], "step": 3, "flag": False, "none": None}
    assert state_problems(dict(live), live, "part") == []
    assert state_problems({**live, "step": 3.0}, live, "part") == []  # numbers are numbers
    saved = {"w": torch.zeros(2, dtype=torch.float64), "lrs": [0.1], "step": "3", "flag": 1,
             "none": None}
    assert state_problems(saved, live, "part") == [
        "part['w']: dtype torch.float64, this run's torch.float32",
        "part['lrs']: 1 entries, this run's 2",
        "part['step']: a str, this run's an int",
        "part['flag']: an int, this run's a bool"]
    assert state_problems({"w": torch.zeros(3)}, {"w": torch.zeros(2)}, "m") == [
        "m['w']: shape (3,), this run's (2,)"]
    assert state_problems(5, {}, "scheduler") == ["scheduler: an int, this run's a dict"]


def test_a_restore_that_fails_after_the_checks_rolls_everything_back(checkpoint, monkeypatch):
    trainer = _trainer()
    before = [p.detach().clone() for p in trainer.model.parameters()]
    scheduler_kind, loaded = type(trainer.scheduler), type(trainer.scheduler).load_state_dict
    calls = []

    def refuse_once(scheduler, state):  # after the model and optimizer are restored
        calls.append(state)
        if len(calls) == 1:
            raise RuntimeError("the scheduler refuses")
        loaded(scheduler, state)  # the roll-back's own restore
    monkeypatch.setattr(scheduler_kind, "load_state_dict", refuse_once)
    with pytest.raises(CheckpointError, match=r"could not be restored \(the scheduler refuses\);"
                                              r" the trainer was rolled back"):
        Resumable(trainer).load_checkpoint(checkpoint)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(),
                                                 strict=True))
    assert not trainer.optimizer.state and trainer.optimizer_steps == 0 and len(calls) == 2
