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
    state_problems,
    window_fingerprint,
    write_checkpoint,
)

__all__ = ["Resumable"]

_FORMAT = 3  # 3: the trainer's own state_dict (history as rows), the model's beside it
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
            **trainer.state_dict(), "format": _FORMAT, "model": model_state,
            "optimizer": optimizer_state, "optimizer_kind": type(trainer.optimizer).__name__,
            "scheduler_kind": type(trainer.scheduler).__name__ if trainer.scheduler else None,
            "scheduler": trainer.scheduler.state_dict() if trainer.scheduler else None,
            "scaler": trainer.scaler.state_dict() if trainer.scaler else None, "ranks": ranks,
            "run": self.run,
        }

    def _check_state(self, state: Mapping[str, Any]) -> None:
        """Raise a ValueError naming every mismatch between ``state`` and this run: its kinds
        and sizes, and every part's types, tensor dtypes and shapes against the live ones."""
        if state.get("format") != _FORMAT:
            raise ValueError(f"checkpoint format is {state.get('format')!r}; this version of "
                             f"gradaccum reads format {_FORMAT}")
        trainer = self.trainer
        problems = [f"{key}: checkpoint {theirs!r}, trainer {mine!r}"
                    for key, theirs, mine in self._kinds(state) if theirs != mine]
        problems += self._model_problems(state["model"])
        problems += self._part_problems(state, {key for key, theirs, mine in self._kinds(state)
                                                if theirs != mine})
        run = state.get("run")
        if not isinstance(run, Mapping):
            problems.append(f"run: checkpoint {run!r}, not a dict of the run's flags")
        else:
            problems += [f"{flag}: checkpoint {run.get(flag)!r}, this run {value!r}"
                         for flag, value in self.run.items() if run.get(flag) != value]
        problems += _rank_problems(state.get("ranks"), trainer.rank, trainer.world_size)
        if problems:
            raise ValueError("checkpoint does not fit this trainer; nothing was restored: "
                             + "; ".join(problems))

    def _kinds(self, state: Mapping[str, Any]) -> list[tuple[str, object, object]]:
        """``(field, checkpoint's, this run's)`` for the sizes and kinds that must match."""
        trainer = self.trainer
        return [(key, state.get(key), mine) for key, mine in (
            ("accumulation_steps", trainer.accumulation_steps),
            ("world_size", trainer.world_size),
            ("optimizer_kind", type(trainer.optimizer).__name__),
            ("scheduler_kind", type(trainer.scheduler).__name__ if trainer.scheduler else None),
        )] + [("scaler", "a GradScaler" if state.get("scaler") is not None else None,
               "a GradScaler" if trainer.scaler else None)]

    def _model_problems(self, saved: object) -> list[str]:
        """Another architecture (names and shapes), else each tensor's type and dtype."""
        live = self._module().state_dict()
        if not isinstance(saved, Mapping):
            return state_problems(saved, live, "model")
        expected = {name: tuple(t.shape) for name, t in live.items()}
        shapes = {name: tuple(getattr(t, "shape", ())) for name, t in saved.items()}
        if shapes != expected:
            missing = sorted(set(expected) - set(shapes))[:5]
            unknown = sorted(set(shapes) - set(expected))[:5]
            reshaped = [n for n in expected if n in shapes and shapes[n] != expected[n]][:5]
            return [f"model: another architecture (missing {missing}, unknown {unknown}, "
                    f"different shapes {reshaped})"]
        return state_problems(saved, live, "model")[:5]

    def _part_problems(self, state: Mapping[str, Any], mismatched: set[str]) -> list[str]:
        """The optimizer's, the scheduler's and the scaler's states against the live ones
        (a part whose kind already differs is not looked into)."""
        trainer, problems = self.trainer, []
        if not isinstance(state["optimizer"], Mapping):
            problems += state_problems(state["optimizer"], {}, "optimizer")
        elif trainer.sync_kind != "fsdp2" and "optimizer_kind" not in mismatched:
            problems += optimizer_state_problems(state["optimizer"], trainer.optimizer)[:5]
        for key, part in (("scheduler", trainer.scheduler), ("scaler", trainer.scaler)):
            if part is not None and not mismatched & {key, f"{key}_kind"}:
                problems += state_problems(state.get(key), part.state_dict(), key)[:5]
        return problems

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


def _is_generator_state(value: object, size: int | None = None) -> bool:
    return (isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1
            and size in (None, value.numel()))


def _rank_problems(ranks: object, rank: int, world_size: int) -> list[str]:
    """What is wrong with this rank's saved generators and replay state."""
    if not isinstance(ranks, list) or len(ranks) != world_size:
        count = len(ranks) if isinstance(ranks, list) else ranks
        return [f"ranks: checkpoint has {count!r} rank states"]
    own = ranks[rank]
    if not isinstance(own, Mapping) or any(key not in own for key in (
            "cpu_rng_state", "epoch_order_states", "sampler_epoch", "window_fingerprint")):
        return [f"ranks: rank {rank}'s state is incomplete"]
    problems = [] if _is_generator_state(own["cpu_rng_state"], torch.get_rng_state().numel()) else [
        f"ranks: rank {rank}'s cpu_rng_state is not this torch's CPU generator state (a uint8 "
        f"tensor of {torch.get_rng_state().numel()})"]
    if "cuda_rng_state" in own and not _is_generator_state(own["cuda_rng_state"]):
        problems.append(f"ranks: rank {rank}'s cuda_rng_state is not a generator state (a uint8 "
                        "tensor)")
    orders, epoch, fingerprint = (own["epoch_order_states"], own["sampler_epoch"],
                                  own["window_fingerprint"])
    if orders is not None and not (isinstance(orders, list)
                                   and all(map(_is_generator_state, orders))):
        problems.append(f"ranks: rank {rank}'s epoch_order_states is not a list of generator "
                        "states or None")
    if epoch is not None and type(epoch) is not int:
        problems.append(f"ranks: rank {rank}'s sampler_epoch is {epoch!r}, not an int or None")
    if fingerprint is not None and not isinstance(fingerprint, str):
        problems.append(f"ranks: rank {rank}'s window_fingerprint is {fingerprint!r:.40}, "
                        "not a SHA-256 or None")
    return problems
