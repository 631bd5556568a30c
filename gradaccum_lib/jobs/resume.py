"""Checkpoints and exact resume around the engine, by composition: :class:`Resumable` takes an
``AccumulationTrainer`` and saves, checks and restores everything a run needs (the model, the
optimizer, the scheduler, the scaler, the generators and the trainer's own ``state_dict``),
and replays an interrupted epoch exactly.

A resumed epoch must see the same micro-batches in the same order. A ``DataLoader`` with
``shuffle=True`` draws its permutation from torch's global generator (or from its own
``generator=``) when its first batch is fetched, so the engine records those generators'
states at the start of every epoch, stores them in the checkpoint, and on resume fetches the
first batch under the recorded states before restoring the mid-epoch ones (for dropout). A
``DistributedSampler`` is replayed by its epoch, which is checked. Whatever the loader, the
last window trained before the checkpoint is fingerprinted (SHA-256 of its tensors), and a
resume whose replayed window differs is refused: never a silent step on the wrong samples.
"""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..accumulation import AccumulationTrainer, TrainingHistory
from ..batches import Batch, check_batch_collection
from ..runtime import check_positive_int
from .checkpoints import (
    CheckpointError,
    optimizer_state_problems,
    read_checkpoint,
    remove_stale_temporaries,
    window_fingerprint,
    write_checkpoint,
)

__all__ = ["Resumable"]

FORMAT = 3  # 3: the trainer's own state_dict (history as rows), the model's beside it
_END = object()


def _order_generators(micro_batches: object) -> list[torch.Generator]:
    """The generators a loader draws its order from, torch's global one first."""
    found = [torch.default_generator]
    for owner in (micro_batches, getattr(micro_batches, "sampler", None)):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
            found.append(generator)
    return found


class _Rest:
    """The micro-batches an epoch has left after the windows a checkpoint had trained: an
    iterator with a length (for the progress bar), held one at a time, not as a list."""

    def __init__(self, iterator: Iterator[Batch], length: int) -> None:
        self.iterator, self.length = iterator, length

    def __iter__(self) -> Iterator[Batch]:
        return self.iterator

    def __len__(self) -> int:
        return self.length


class Resumable:
    """Checkpointing and exact resume for an :class:`AccumulationTrainer` (which it takes);
    ``run``, the values that define the run (e.g. a job's flags), is saved and must match.

    ``Resumable(trainer).train_epoch(loader, checkpoint_path=..., checkpoint_every=...)``
    trains like ``trainer.train_epoch`` and writes a checkpoint every so many windows; after
    :meth:`load_checkpoint`, :meth:`train_epoch` with the same loader skips the windows already
    trained, checks that the last of them is the one trained before (SHA-256), and goes on.
    """

    def __init__(self, trainer: AccumulationTrainer,
                 run: Mapping[str, object] | None = None) -> None:
        if not isinstance(trainer, AccumulationTrainer):
            raise TypeError(f"trainer must be an AccumulationTrainer; got "
                            f"{type(trainer).__name__}")
        self.trainer, self.run = trainer, dict(run or {})
        self._epoch_order_states: list[torch.Tensor] | None = None
        self._sampler_epoch: int | None = None
        self._last_window: Sequence[Batch] | None = None
        self._replay_fingerprint: str | None = None

    def train_epoch(self, micro_batches: Iterable[Batch], *, max_windows: int | None = None,
                    checkpoint_path: str | os.PathLike | None = None,
                    checkpoint_every: int | None = None) -> TrainingHistory:
        """Train on one epoch of micro-batches, resuming where a checkpoint left it; every
        ``checkpoint_every`` windows write a checkpoint to ``checkpoint_path``; return the
        trainer's history. Pass the same micro-batches as before an interruption (a shuffling
        ``DataLoader`` or a ``DistributedSampler`` is replayed exactly; an order that cannot
        be replayed is refused with an error, never trained on)."""
        if (checkpoint_path is None) != (checkpoint_every is None):
            raise ValueError("give both checkpoint_path and checkpoint_every, or neither")
        if checkpoint_every is not None:
            check_positive_int("checkpoint_every", checkpoint_every)
        if checkpoint_path is not None and not isinstance(checkpoint_path, (str, os.PathLike)):
            raise TypeError(f"checkpoint_path must be a path (str or os.PathLike); got "
                            f"{type(checkpoint_path).__name__}")
        check_batch_collection(micro_batches)
        trainer, steps = self.trainer, self.trainer.accumulation_steps
        iterator = self._replayed(micro_batches)
        for index in range(trainer.windows_done):  # trained before the interruption
            window = list(itertools.islice(iterator, steps))
            if not window:
                raise ValueError(f"micro_batches hold {index} windows but the checkpoint had "
                                 f"already trained {trainer.windows_done} of this epoch; pass "
                                 "the same micro-batches as before the interruption")
            self._check_replay(index, window)
        rest = (_Rest(iterator, len(micro_batches) - trainer.windows_done * steps)
                if hasattr(micro_batches, "__len__") else iterator)

        def after_window(window: Sequence[Batch]) -> None:
            self._last_window = window
            if checkpoint_every is not None and trainer.windows_done % checkpoint_every == 0:
                self.save_checkpoint(checkpoint_path)

        history = trainer.train_epoch(rest, max_windows=max_windows, after_window=after_window)
        if trainer.windows_done == 0:  # the epoch is over
            self._last_window = None
        return history

    def _replayed(self, micro_batches: Iterable[Batch]) -> Iterator[Batch]:
        """Iterate ``micro_batches``, drawing a shuffled order from the epoch's recorded
        generator states when resuming mid-epoch."""
        generators = _order_generators(micro_batches)
        sampler = getattr(micro_batches, "sampler", None)
        resuming = self.trainer.windows_done > 0
        if resuming and self._epoch_order_states is not None:
            if len(self._epoch_order_states) != len(generators):
                raise ValueError(
                    "cannot replay the epoch: the checkpoint recorded "
                    f"{len(self._epoch_order_states)} order generator(s) but this loader draws "
                    f"from {len(generators)}; pass the same kind of loader as before")
            mid_epoch = torch.get_rng_state()  # restored from the checkpoint (dropout...)
            for generator, state in zip(generators, self._epoch_order_states, strict=True):
                generator.set_state(state)
        elif not resuming:
            self._epoch_order_states = [g.get_state() for g in generators]
        if hasattr(sampler, "set_epoch") and isinstance(getattr(sampler, "epoch", None), int):
            saved_epoch = self._sampler_epoch
            if resuming and saved_epoch is not None and sampler.epoch != saved_epoch:
                raise ValueError(
                    f"the loader's sampler is at epoch {sampler.epoch} but the checkpoint was "
                    f"taken in its epoch {self._sampler_epoch}; call "
                    f"sampler.set_epoch({self._sampler_epoch}) before resuming")
            self._sampler_epoch = sampler.epoch
        iterator = iter(micro_batches)
        first = next(iterator, _END)  # a shuffling loader draws its order here
        if resuming and self._epoch_order_states is not None:
            torch.set_rng_state(mid_epoch)  # a loader's own generator stays where the draw left it
        return iter(()) if first is _END else itertools.chain([first], iterator)

    def _check_replay(self, index: int, window: Sequence[Batch]) -> None:
        if index == self.trainer.windows_done - 1 and self._replay_fingerprint is not None:
            if window_fingerprint(window) != self._replay_fingerprint:
                raise ValueError(
                    f"the micro-batches given after the resume do not replay the interrupted "
                    f"run: window {index} differs from the one trained before the checkpoint. "
                    "Pass the same data in the same order (a DistributedSampler needs the same "
                    "set_epoch; a custom shuffle needs its generator's state restored)")
            self._replay_fingerprint = None

    def _remember_window(self, window: Sequence[Batch]) -> None:
        self._last_window = window

    # ------------------------------------------------------------------------ state dicts

    def _module(self) -> torch.nn.Module:
        trainer = self.trainer
        return trainer.model.module if trainer.sync_kind == "ddp" else trainer.model

    def _model_and_optimizer_state(self) -> tuple[dict, dict]:
        trainer = self.trainer
        if trainer.sync_kind == "fsdp2":  # gather the shards into full tensors (collective)
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
                get_optimizer_state_dict,
            )
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            return (get_model_state_dict(trainer.model, options=options),
                    get_optimizer_state_dict(trainer.model, trainer.optimizer, options=options))
        return self._module().state_dict(), trainer.optimizer.state_dict()

    def state_dict(self) -> dict[str, Any]:
        """Return everything needed to resume at this window boundary (plain data and
        tensors): the trainer's ``state_dict`` and, beside it, the model's, the optimizer's,
        the scheduler's, the scaler's and every rank's generators; collective across ranks."""
        trainer = self.trainer
        own = {"cpu_rng_state": torch.get_rng_state(),
               "epoch_order_states": self._epoch_order_states,
               "sampler_epoch": self._sampler_epoch,
               "window_fingerprint": (window_fingerprint(self._last_window)
                                      if self._last_window is not None and trainer.windows_done
                                      else None)}
        if torch.cuda.is_available():
            own["cuda_rng_state"] = torch.cuda.get_rng_state()
        ranks = [own]
        if trainer.world_size > 1:
            ranks = [None] * trainer.world_size
            dist.all_gather_object(ranks, own)
        model_state, optimizer_state = self._model_and_optimizer_state()
        return {
            **trainer.state_dict(), "format": FORMAT, "model": model_state,
            "optimizer": optimizer_state, "optimizer_kind": type(trainer.optimizer).__name__,
            "scheduler_kind": type(trainer.scheduler).__name__ if trainer.scheduler else None,
            "scheduler": trainer.scheduler.state_dict() if trainer.scheduler else None,
            "scaler": trainer.scaler.state_dict() if trainer.scaler else None, "ranks": ranks,
            "run": self.run,
        }

    def _check_state(self, state: Mapping[str, Any]) -> None:
        """Raise a ValueError naming every mismatch between ``state`` and this run."""
        trainer = self.trainer
        if state.get("format") != FORMAT:
            raise ValueError(f"checkpoint format is {state.get('format')!r}; this version of "
                             f"gradaccum reads format {FORMAT}")
        problems = []
        for key, mine in (("accumulation_steps", trainer.accumulation_steps),
                          ("world_size", trainer.world_size),
                          ("optimizer_kind", type(trainer.optimizer).__name__),
                          ("scheduler_kind", type(trainer.scheduler).__name__
                           if trainer.scheduler else None),
                          ("scaler", "a GradScaler" if trainer.scaler else None)):
            theirs = state.get(key)
            if key == "scaler":
                theirs = "a GradScaler" if theirs is not None else None
            if theirs != mine:
                problems.append(f"{key}: checkpoint {theirs!r}, trainer {mine!r}")
        expected = {name: tuple(t.shape) for name, t in self._module().state_dict().items()}
        saved = {name: tuple(t.shape) for name, t in state["model"].items()}
        if saved != expected:
            missing = sorted(set(expected) - set(saved))[:5]
            unknown = sorted(set(saved) - set(expected))[:5]
            reshaped = [n for n in expected if n in saved and saved[n] != expected[n]][:5]
            problems.append(f"model: another architecture (missing {missing}, unknown "
                            f"{unknown}, different shapes {reshaped})")
        if trainer.sync_kind != "fsdp2":  # FSDP2 saves full tensors for sharded parameters
            problems += optimizer_state_problems(state["optimizer"], trainer.optimizer)
        problems += [f"{flag}: checkpoint {state.get('run', {}).get(flag)!r}, this run {value!r}"
                     for flag, value in (self.run or {}).items()
                     if state.get("run", {}).get(flag) != value]
        ranks, rank = state.get("ranks", []), trainer.rank
        if len(ranks) != trainer.world_size:
            problems.append(f"ranks: checkpoint has {len(ranks)} rank states")
        elif not (isinstance(ranks[rank], Mapping) and isinstance(
                ranks[rank].get("cpu_rng_state"), torch.Tensor)
                and ranks[rank]["cpu_rng_state"].dtype == torch.uint8
                and all(key in ranks[rank] for key in (
                    "epoch_order_states", "sampler_epoch", "window_fingerprint"))):
            problems.append(f"ranks: rank {rank}'s state is incomplete or not a generator "
                            "state")
        if problems:
            raise ValueError("checkpoint does not fit this trainer; nothing was restored: "
                             + "; ".join(problems))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned: everything, or (on any mismatch)
        nothing."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict; got {type(state).__name__}")
        required = ("model", "optimizer", "epoch", "windows_done", "optimizer_steps", "history")
        missing = [key for key in required if key not in state]
        if missing:
            raise ValueError(f"checkpoint state is missing {missing}; nothing was restored")
        self._check_state(state)
        trainer = self.trainer
        own = state["ranks"][trainer.rank]
        parts = [part for part in (trainer.scheduler, trainer.scaler) if part is not None]
        backup = (copy.deepcopy(self._module().state_dict()),
                  copy.deepcopy(trainer.optimizer.state_dict()),
                  [copy.deepcopy(part.state_dict()) for part in parts], torch.get_rng_state(),
                  trainer.state_dict())
        trainer.load_state_dict(state)  # checks its own fields first; restores all or nothing
        try:
            self._restore_model_and_optimizer(state["model"], state["optimizer"])
            if trainer.scheduler is not None:
                trainer.scheduler.load_state_dict(state["scheduler"])
            if trainer.scaler is not None:
                trainer.scaler.load_state_dict(state["scaler"])
            torch.set_rng_state(own["cpu_rng_state"])
            if "cuda_rng_state" in own and torch.cuda.is_available():
                torch.cuda.set_rng_state(own["cuda_rng_state"])
        except Exception as error:
            self._module().load_state_dict(backup[0])  # this rank's own (sharded) state
            trainer.optimizer.load_state_dict(backup[1])
            for part, part_state in zip(parts, backup[2], strict=True):
                part.load_state_dict(part_state)
            torch.set_rng_state(backup[3])
            trainer.load_state_dict(backup[4])
            raise ValueError(f"checkpoint could not be restored ({error}); the trainer was "
                             "rolled back to its state before the load") from error
        self._epoch_order_states = own["epoch_order_states"]
        self._sampler_epoch = own["sampler_epoch"]
        self._replay_fingerprint = own["window_fingerprint"]
        self._last_window = None

    def _restore_model_and_optimizer(self, model_state: dict, optimizer_state: dict) -> None:
        trainer = self.trainer
        if trainer.sync_kind == "fsdp2":
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )
            options = StateDictOptions(full_state_dict=True)
            set_model_state_dict(trainer.model, model_state, options=options)
            set_optimizer_state_dict(trainer.model, trainer.optimizer, optimizer_state,
                                     options=options)
            return
        self._module().load_state_dict(model_state)
        trainer.optimizer.load_state_dict(optimizer_state)

    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Write :meth:`state_dict` to ``path``: rank 0 writes (atomically, with a content
        hash), every rank waits until it is on disk."""
        state = self.state_dict()
        if self.trainer.rank == 0:
            write_checkpoint(state, path)
        if self.trainer.world_size > 1:
            dist.barrier()

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        """Restore from a checkpoint file (verified, ``weights_only=True``) on every rank;
        raise :class:`~gradaccum_lib.jobs.checkpoints.CheckpointError` naming ``path`` when it
        is unreadable or does not fit this trainer."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a path (str or os.PathLike); got {type(path).__name__}")
        # to the CPU: generator states must stay CPU ByteTensors; load_state_dict copies the
        # model's tensors onto its device and the optimizer moves its state to its parameters'
        remove_stale_temporaries(path)  # a save killed mid-write left one
        state = read_checkpoint(path, map_location="cpu")
        try:
            self.load_state_dict(state)
        except (ValueError, KeyError, TypeError) as error:
            raise CheckpointError(f"checkpoint {os.fspath(path)}: {error}") from error
