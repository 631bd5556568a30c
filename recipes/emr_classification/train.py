"""The EMR case study as a job: fine-tune a BERT classifier with accumulation, anywhere.

    python -m recipes.emr_classification.train --accumulation-steps 4 --micro-batch-size 8 \\
        --checkpoint-dir build/run --resume --json build/run/log.json
    torchrun --standalone --nproc_per_node=2 --max-restarts=1 \\
        -m recipes.emr_classification.train ...

The same command runs as one process or under ``torchrun`` (gloo on CPU, nccl on CUDA), on
one node or several. The job owns its epochs, the way a torchtune recipe does: each epoch,
every rank takes its ``DistributedSampler`` shard of the shipped EMR corpus, cuts it into
micro-batches and windows (``windows_of``), agrees with the other ranks that each holds as
many (``agree_on_windows``: otherwise every rank stops, naming the short one) and calls the
series' one loop, :func:`~gradaccum_lib.accumulation.accumulate_window`, once per window. Rank 0
shows a progress bar, keeps the per-window history, writes atomic checkpoints every
``--checkpoint-every`` windows and at each epoch's end, evaluates the whole validation split
after each epoch (gathered across ranks, no sample counted twice), writes ``final.pt`` (the model's
``state_dict``) and the JSON log, and prints the path of every file it wrote.

Its command line is checked before anything is built or written: the flags, the sizes against
the data, and every path the job will write. With ``--resume`` a (re)started job continues
from the checkpoint in ``--checkpoint-dir``, after one check of everything it holds against
this run (the flags that define the run, every part's types, dtypes and shapes, and its
counters, history and last window against the run's epochs and data), made before anything
is restored: after torchrun restarts a lost worker's group, the run ends bit-for-bit where an
uninterrupted one would. Every start first removes the temporaries a killed run left beside
the job's files; a resume whose checkpoint holds an epoch's end model but not its validation
record evaluates that epoch again, and a record that cannot be recovered is named, never
dropped in silence.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import io
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler
from tqdm.auto import tqdm

from gradaccum_lib.accumulation import accumulate_window
from gradaccum_lib.batches import split_into_micro_batches, windows_of
from gradaccum_lib.distributed import (
    DistributedContext,
    agree_on_windows,
    init_distributed,
    process_group_session,
)
from gradaccum_lib.losses import bert_classification_loss
from gradaccum_lib.measure.comm import CommCounter
from gradaccum_lib.measure.metrics import classification_scores, predict_classes
from gradaccum_lib.runtime import get_profile, set_seed
from gradaccum_lib.workloads.data import LABELS, encode_records, load_emr_split, load_tokenizer
from gradaccum_lib.workloads.models import make_tiny_bert

from .checkpoints import (
    CheckpointError,
    read_checkpoint,
    remove_stale_temporaries,
    write_atomically,
    write_checkpoint,
)

__all__ = ["JobError", "build_model", "main", "parse_arguments"]


# The command line: its flags, the checks of its sizes against the data and of the paths it
# writes (made before anything is built or written), and the flags that define a run, which
# its checkpoints carry (a resume with any of them changed is refused, naming the flag). --------

_MODEL_SIZES = ("tiny", "base")
_AMP = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int; got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0; got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0; got {text}")
    return value


#: more epochs than any run of the case study needs (the gpu profile trains 20): a typo's
#: 1000000000 would otherwise run until stopped
_MAX_EPOCHS = 10_000


class _Parser(argparse.ArgumentParser):
    """argparse, refusing a bad command line in one line (no usage block), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Return the command line parsed and checked (argparse errors for bad flags)."""
    parser = _Parser(prog="python -m recipes.emr_classification.train",
                     description=__doc__.split("\n\n")[0])
    _add_run_flags(parser.add_argument)
    _add_job_flags(parser.add_argument)
    arguments = parser.parse_args(argv)
    if arguments.epochs > _MAX_EPOCHS:
        parser.error(f"--epochs must be at most {_MAX_EPOCHS:,}; got {arguments.epochs:,}")
    if not 0.0 <= arguments.window_delay <= 60.0:  # NaN fails too
        parser.error(f"--window-delay must be between 0 and 60 s; got {arguments.window_delay}")
    if not 0.0 <= arguments.dropout < 1.0:
        parser.error(f"--dropout must be in [0, 1); got {arguments.dropout}")
    if arguments.max_length > 512:
        parser.error(f"--max-length must be at most 512 (BERT's positions); got "
                     f"{arguments.max_length}")
    if arguments.max_length < 3:
        parser.error("--max-length must be at least 3 ([CLS], a token, [SEP])")
    if (arguments.checkpoint_every or arguments.resume) and arguments.checkpoint_dir is None:
        parser.error("--checkpoint-every and --resume need --checkpoint-dir")
    if arguments.amp == "fp16" and not torch.cuda.is_available():
        parser.error("--amp fp16 needs CUDA (GradScaler); use --amp bf16 on a CPU")
    return arguments


def _add_run_flags(add: Callable[..., object]) -> None:
    """The flags of the model, the data and the optimization (most of them define the run)."""
    profile = get_profile()
    add("--accumulation-steps", type=_positive_int, default=4)
    add("--micro-batch-size", type=_positive_int, default=8)
    add("--epochs", type=_positive_int, default=profile.emr_epochs,
        help="default: the profile's (ci and cpu 8, gpu 20; the ci run reaches validation "
             "macro-F1 about 0.8, see docs/training.md)")
    add("--lr", type=_positive_float, default=profile.emr_lr,
        help="AdamW's peak learning rate (default: the profile's: ci 3e-3, cpu and gpu 1e-3)")
    add("--warmup-steps", type=_non_negative_int, default=None,
        help="linear warm-up, in optimizer steps (default: a tenth of all of them), then "
             "linear decay to 0")
    add("--max-grad-norm", type=_positive_float, default=1.0)
    add("--amp", choices=tuple(_AMP), default="none",
        help="autocast: bf16 (CPU or GPU) or fp16 with GradScaler (CUDA only)")
    add("--dtype", choices=tuple(_DTYPES), default="float32",
        help="parameter dtype (float64 for bit-exact comparisons)")
    add("--seed", type=_non_negative_int, default=0,
        help="model initialisation and sampler order; dropout uses seed + rank")
    add("--dropout", type=float, default=0.1,
        help="dropout probability (0: runs split differently over ranks give equal results)")
    add("--model-size", choices=_MODEL_SIZES, default="tiny",
        help="tiny: sized by GRADACCUM_PROFILE (hidden x layers, default --max-length: ci "
             "64 x 2, 128; cpu 128 x 2, 256; gpu 256 x 4, 512); base: BERT-base (768 x 12 "
             "layers, for a GPU)")
    add("--max-length", type=_positive_int, default=profile.max_length,
        help="tokens per note (the article's records are 512)")
    add("--train-samples", type=_positive_int, default=None, help="default: the whole split")
    add("--validation-samples", type=_positive_int, default=None)
    add("--drop-last", action="store_true",
        help="drop the samples that do not divide by the world size (default: the sampler "
             "repeats a few to even the ranks out)")


def _add_job_flags(add: Callable[..., object]) -> None:
    """The flags of where the job writes, how it resumes, and how it shows progress."""
    add("--checkpoint-dir", type=Path, default=None)
    add("--checkpoint-every", type=_positive_int, default=None, help="windows")
    add("--resume", action="store_true",
        help="continue from the checkpoint in the directory (only --epochs, --checkpoint-every, "
             "--json, --no-progress and --timeout may change; the flags that define the run "
             "must match the checkpoint's)")
    add("--json", type=Path, default=None, help="where rank 0 writes the log")
    add("--no-progress", action="store_true")
    add("--timeout", type=_positive_float, default=300.0, help="process-group timeout, s")
    # fault tests only: a pause after every window, so that a test can kill a worker mid-epoch
    # (the tests' job trains an epoch in well under a second); hidden from --help
    add("--window-delay", type=float, default=0.0, help=argparse.SUPPRESS)


#: the flags that define a run: a checkpoint stores them, a resume must repeat them
_RUN_FLAGS = ("model_size", "max_length", "dtype", "dropout", "micro_batch_size",
             "accumulation_steps", "train_samples", "validation_samples", "drop_last", "seed",
             "lr", "warmup_steps", "max_grad_norm", "amp")


class JobError(ValueError):
    """A refusal of the job's arguments, printed as one line (no traceback) with exit code 2."""


def _run_definition(arguments: argparse.Namespace, world_size: int) -> dict[str, object]:
    """Return ``{"--flag": value}`` for the flags that define the run, the world size and the
    profile (it sizes the tiny model)."""
    return {**{"--" + name.replace("_", "-"): getattr(arguments, name) for name in _RUN_FLAGS},
            "world size": world_size, "GRADACCUM_PROFILE": get_profile().name}


def _check_sizes(arguments: argparse.Namespace, corpus_size: int, world_size: int,
                 validation_size: int | None = None) -> str:
    """Refuse sizes that cannot be meant (:class:`JobError`, naming the numbers); return a note
    for the start line when the sampler repeats or drops samples to even the ranks out."""
    for flag, asked, split, size in (("--train-samples", arguments.train_samples, "train",
                                      corpus_size),
                                     ("--validation-samples", arguments.validation_samples,
                                      "validation", validation_size)):
        if asked is not None and size is not None and asked > size:
            raise JobError(f"{flag} {asked} is more than the {split} split's {size} notes")
    samples = arguments.train_samples or corpus_size
    ranks = f"{world_size} rank{'s' if world_size > 1 else ''}"
    per_rank = samples // world_size if arguments.drop_last else math.ceil(samples / world_size)
    if arguments.micro_batch_size > per_rank:
        raise JobError(f"--micro-batch-size {arguments.micro_batch_size} is more than a rank's "
                       f"{per_rank} samples per epoch ({samples} samples / {ranks})")
    micro_batches = math.ceil(per_rank / arguments.micro_batch_size)
    if arguments.accumulation_steps > micro_batches:
        raise JobError(
            f"--accumulation-steps {arguments.accumulation_steps} is more than the "
            f"{micro_batches} micro-batches a rank has per epoch ({per_rank} samples per rank "
            f"/ micro-batch {arguments.micro_batch_size}): an epoch would be one partial "
            f"window; use at most {micro_batches}")
    uneven = samples % world_size
    if not uneven:
        return ""
    if arguments.drop_last:
        return f"; {samples} samples over {world_size} ranks: {uneven} dropped (--drop-last)"
    return (f"; {samples} samples over {world_size} ranks: the sampler repeats "
            f"{world_size - uneven} to even them out (--drop-last drops {uneven} instead)")


_CHECKPOINT, _EPOCHS_LOG, _FINAL = "checkpoint.pt", "epochs.json", "final.pt"


def _check_paths(arguments: argparse.Namespace) -> None:
    """Refuse (:class:`JobError`, naming the flag) a path the job could not write: a folder
    where it writes a file or the reverse, a file on the way, a folder it may not write in."""
    directory, log = arguments.checkpoint_dir, arguments.json
    wanted = [] if directory is None else [("--checkpoint-dir", directory, directory, True)] + [
        ("--checkpoint-dir", directory, directory / name, False)
        for name in (_CHECKPOINT, _EPOCHS_LOG, _FINAL)]
    for flag, given, path, folder in wanted + ([("--json", log, log, False)] if log else []):
        if path.is_dir() != folder and path.exists():
            kind = ("a file, not a folder" if folder else
                    "a folder; the job writes a file there")
            raise JobError(f"{flag} {given}: {path} is {kind}")
        nearest = path if folder and path.is_dir() else path.parent
        while not nearest.exists() and nearest != nearest.parent:
            nearest = nearest.parent  # the folder the job would create the rest in
        if not nearest.is_dir():
            raise JobError(f"{flag} {given}: {nearest} is a file, not a folder")
        if not os.access(nearest, os.W_OK | os.X_OK):
            raise JobError(f"{flag} {given}: the job may not write in {nearest} (permission "
                           "denied)")


# The job: its parts, its epochs, its one state_dict and the one check of a checkpoint. --------

_FORMAT = 4  # 4: the job's own state (issue 36); 3 was the engine's, around AccumulationTrainer
_STATE_KEYS = ("run", "epoch", "windows_done", "optimizer_steps", "history", "window_fingerprint",
               "model", "optimizer", "scheduler", "scaler", "ranks")
_HISTORY_ROW = {"loss": 0.0, "lr": 0.0, "grad_norm": 0.0, "items": 0.0, "epoch": 0}
_RECORD = {"epoch": 0, "validation_loss": 0.0, "accuracy": 0.0, "macro_f1": 0.0,
           "validation_samples": 0}


@dataclass
class _Job:
    """The run: its flags, the process group, the data, the model (``base`` unwrapped,
    ``model`` as trained), its optimizer, schedule and scaler, and where it stands."""

    arguments: argparse.Namespace
    ctx: DistributedContext
    columns: dict[str, Tensor]  # the encoded training notes
    validation: dict[str, Tensor]
    base: nn.Module
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler | None
    counter: CommCounter
    windows_per_epoch: int
    epoch: int = 0
    windows_done: int = 0  # of this epoch
    optimizer_steps: int = 0
    history: list[dict] = field(default_factory=list)  # one row per window
    records: list[dict] = field(default_factory=list)  # one validation record per epoch
    lost: list[int] = field(default_factory=list)  # epochs whose record cannot be recovered

    @property
    def effective_batch(self) -> int:
        arguments = self.arguments
        return arguments.micro_batch_size * arguments.accumulation_steps * self.ctx.world_size

    def path(self, name: str) -> Path | None:
        """The path of one of the job's files in --checkpoint-dir (None without one)."""
        directory = self.arguments.checkpoint_dir
        return None if directory is None else directory / name


def build_model(arguments: argparse.Namespace, vocab_size: int) -> nn.Module:
    """Return the classifier: the profile's tiny BERT or a BERT-base-sized one."""
    profile = get_profile()
    sizes = ({"hidden_size": profile.bert_hidden, "num_layers": profile.bert_layers,
              "num_heads": profile.bert_heads} if arguments.model_size == "tiny" else
             {"hidden_size": 768, "num_layers": 12, "num_heads": 12})
    return make_tiny_bert(vocab_size, len(LABELS), **sizes, max_length=arguments.max_length,
                          dropout=arguments.dropout, seed=arguments.seed,
                          dtype=_DTYPES[arguments.dtype])


def _warmup_then_linear(optimizer: torch.optim.Optimizer, warmup_steps: int,
                        total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Return a schedule counted in OPTIMIZER steps: linear warm-up, then linear decay."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _build(arguments: argparse.Namespace, ctx: DistributedContext) -> tuple[_Job, str]:
    """Check the sizes (before anything is built), encode the data, build the model, AdamW,
    its schedule and (fp16) the scaler; return the job and the start line's note."""
    corpus, validation = load_emr_split("train"), load_emr_split("validation")
    note = _check_sizes(arguments, len(corpus), ctx.world_size, len(validation))
    tokenizer = load_tokenizer()
    columns = encode_records(corpus[:arguments.train_samples], tokenizer, arguments.max_length)
    validation = encode_records(validation[:arguments.validation_samples], tokenizer,
                                arguments.max_length)
    base = build_model(arguments, len(tokenizer)).to(ctx.device)
    counter = CommCounter()
    model: nn.Module = base
    if ctx.world_size > 1:
        # .grad as views into DDP's buckets: no second copy of the gradients (measured in 00)
        model = DistributedDataParallel(base, gradient_as_bucket_view=True)
        counter.register(model)
    per_rank = len(DistributedSampler(range(len(columns["labels"])), ctx.world_size, 0,
                                      drop_last=arguments.drop_last))
    windows_per_epoch = -(-per_rank // (arguments.micro_batch_size
                                        * arguments.accumulation_steps))
    optimizer = torch.optim.AdamW(model.parameters(), lr=arguments.lr)
    total = arguments.epochs * windows_per_epoch
    warmup = (arguments.warmup_steps if arguments.warmup_steps is not None
              else math.ceil(total / 10))
    # fp16: a summed loss is the window's items times a mean one; start the scale that much
    # lower and GradScaler skips no step to find it (accumulation.py's docstring)
    items = arguments.micro_batch_size * arguments.accumulation_steps * ctx.world_size
    scaler = (torch.amp.GradScaler("cuda", init_scale=2.0**16 / items)
              if arguments.amp == "fp16" else None)
    return _Job(arguments, ctx, columns, validation, base, model, optimizer,
                _warmup_then_linear(optimizer, warmup, total), scaler, counter,
                windows_per_epoch), note


def _rows(job: _Job, epoch: int, rank: int) -> Tensor:
    """The training rows rank ``rank`` takes in epoch ``epoch``, in order: its
    ``DistributedSampler`` shard, shuffled by the seed and the epoch (no global generator)."""
    sampler = DistributedSampler(range(len(job.columns["labels"])), job.ctx.world_size, rank,
                                 shuffle=True, seed=job.arguments.seed,
                                 drop_last=job.arguments.drop_last)
    sampler.set_epoch(epoch)
    return torch.tensor(list(sampler), dtype=torch.long)


def _fingerprint(job: _Job, trained: int) -> str | None:
    """The SHA-256 of the global window the run trained last after ``trained`` windows (every
    rank's rows of it, every column), or None before the first: a resume replays the data."""
    if trained == 0:
        return None
    epoch, window = divmod(trained - 1, job.windows_per_epoch)
    size = job.arguments.micro_batch_size * job.arguments.accumulation_steps
    digest = hashlib.sha256()
    for rank in range(job.ctx.world_size):
        rows = _rows(job, epoch, rank)[window * size:(window + 1) * size]
        for key in sorted(job.columns):
            digest.update(job.columns[key][rows].contiguous().numpy().tobytes())
    return digest.hexdigest()


def _train(job: _Job) -> None:
    """Train the remaining epochs, window by window with the series' loop; after each epoch,
    its validation record, written before the epoch-end checkpoint (a kill between the two
    resumes before the record and redoes it)."""
    arguments, ctx = job.arguments, job.ctx
    checkpoint, every = job.path(_CHECKPOINT), arguments.checkpoint_every
    for epoch in range(job.epoch, arguments.epochs):
        rows = list(_rows(job, epoch, ctx.rank).split(arguments.micro_batch_size))
        windows = list(windows_of(rows, arguments.accumulation_steps))  # of row indices
        agree_on_windows(job.model, windows)  # every rank holds as many, or every rank stops
        # at most one redraw a second: each is a message to a notebook's front end
        with tqdm(total=job.windows_per_epoch, initial=job.windows_done, desc=f"epoch {epoch}",
                  unit="step", disable=arguments.no_progress or not ctx.is_main,
                  mininterval=1.0) as bar:
            for rows_of_window in windows[job.windows_done:]:  # a resume skips what it trained
                window = [{key: column[part].to(ctx.device) for key, column in job.columns.items()}
                          for part in rows_of_window]
                lr = job.optimizer.param_groups[0]["lr"]
                result = accumulate_window(
                    job.model, job.optimizer, window, bert_classification_loss,
                    scheduler=job.scheduler, scaler=job.scaler,
                    max_grad_norm=arguments.max_grad_norm, autocast_dtype=_AMP[arguments.amp])
                job.history.append({"loss": result.loss, "lr": lr, "grad_norm": result.grad_norm,
                                    "items": result.items, "epoch": epoch})
                job.windows_done += 1
                job.optimizer_steps += result.stepped
                if not bar.disable:
                    bar.set_postfix(loss=f"{result.loss:.4f}", lr=f"{lr:.2e}", refresh=False)
                    bar.update(1)
                if every and job.windows_done % every == 0 and (
                        job.windows_done < job.windows_per_epoch):  # the epoch's end saves below
                    _save(job)
                if arguments.window_delay:
                    time.sleep(arguments.window_delay)
        job.epoch, job.windows_done = epoch + 1, 0
        job.records.append(_evaluate(job, epoch))
        if checkpoint is not None:  # the epoch boundary is a resume point too
            if ctx.is_main:
                _write_json(job.path(_EPOCHS_LOG), job.records)
            _save(job)


def _state_dict(job: _Job) -> dict[str, Any]:
    """The job's one state: everything a resume at this window boundary needs (plain data and
    tensors); collective across ranks (every rank's generators)."""
    own = {"cpu_rng_state": torch.get_rng_state()}
    if torch.cuda.is_available():
        own["cuda_rng_state"] = torch.cuda.get_rng_state()
    ranks = [own]
    if job.ctx.world_size > 1:
        ranks = [None] * job.ctx.world_size
        dist.all_gather_object(ranks, own)
    trained = job.epoch * job.windows_per_epoch + job.windows_done
    return {"format": _FORMAT, "run": _run_definition(job.arguments, job.ctx.world_size),
            "epoch": job.epoch, "windows_done": job.windows_done,
            "optimizer_steps": job.optimizer_steps, "history": job.history,
            "window_fingerprint": _fingerprint(job, trained), "model": job.base.state_dict(),
            "optimizer": job.optimizer.state_dict(), "scheduler": job.scheduler.state_dict(),
            "scaler": None if job.scaler is None else job.scaler.state_dict(), "ranks": ranks}


def _save(job: _Job) -> None:
    """Write the state to the checkpoint: rank 0 writes (atomically, with a content hash),
    every rank waits until it is on disk."""
    state = _state_dict(job)
    if job.ctx.is_main:
        write_checkpoint(state, job.path(_CHECKPOINT))
    if job.ctx.world_size > 1:
        dist.barrier()


def _problems(job: _Job, state: Mapping[str, Any]) -> list[str]:
    """Everything that keeps ``state`` from resuming this run, each naming its field: the
    flags that define the run; every part's types, dtypes and shapes against the live ones;
    the counters, the history and the last window's data against this run's epochs and data.
    The same on every rank (every rank refuses together)."""
    if state.get("format") != _FORMAT:
        return [f"format {state.get('format')!r}; this version reads format {_FORMAT}"]
    missing = [key for key in _STATE_KEYS if key not in state]
    run = state.get("run")
    if missing or not isinstance(run, Mapping):
        return [f"missing {missing}" if missing else f"run: {run!r:.60}, not the run's flags"]
    flags = _run_definition(job.arguments, job.ctx.world_size)
    problems = [f"{flag}: checkpoint {run.get(flag)!r}, this run {value!r}"
                for flag, value in flags.items() if run.get(flag) != value]
    if problems:  # another run: its other differences follow from these
        return problems
    own = {"cpu_rng_state": torch.get_rng_state()}
    if torch.cuda.is_available():
        own["cuda_rng_state"] = torch.cuda.get_rng_state()
    scaler = None if job.scaler is None else job.scaler.state_dict()
    for key, live in (("model", job.base.state_dict()), ("scheduler", job.scheduler.state_dict()),
                      ("scaler", scaler), ("ranks", [own] * job.ctx.world_size)):
        problems += _state_problems(state[key], live, key)[:5]
    problems += _optimizer_problems(state["optimizer"], job.optimizer)[:5]
    counters = {key: state[key] for key in ("epoch", "windows_done", "optimizer_steps")}
    wrong = [f"{key}: {value!r}, not an int >= 0" for key, value in counters.items()
             if type(value) is not int or value < 0]
    if wrong:
        return problems + wrong
    epoch, windows, steps = counters.values()
    per_epoch, epochs, history = job.windows_per_epoch, job.arguments.epochs, state["history"]
    trained = epoch * per_epoch + windows
    last_epoch = (state["scheduler"].get("last_epoch") if isinstance(state["scheduler"], Mapping)
                  else None)
    if windows >= per_epoch:
        problems.append(f"windows_done: {windows}, but an epoch of this run has {per_epoch} "
                        "windows")
    elif not isinstance(history, list) or len(history) != trained:
        problems.append(f"history: {len(history) if isinstance(history, list) else history!r:.20}"
                        f" windows, but epoch {epoch} and windows_done {windows} say {trained}")
    else:
        problems += _state_problems(history, [_HISTORY_ROW] * trained, "history")[:1]
    if windows < per_epoch and (steps != last_epoch or steps > trained
                                or (job.scaler is None and steps != trained)):
        problems.append(f"optimizer_steps: {steps}, but the checkpoint trained {trained} windows "
                        f"(epoch {epoch}, window {windows}) and its schedule took "
                        f"{last_epoch!r} steps")
    if problems:
        return problems
    if trained > epochs * per_epoch:  # a checkpoint of this run, but past its end
        return [f"--epochs {epochs}: the checkpoint has trained past it (epoch {epoch}, "
                f"{windows} of its {per_epoch} windows done); resume with --epochs "
                f"{epoch + (windows > 0)} or more"]
    if state["window_fingerprint"] != _fingerprint(job, trained):
        return [f"window_fingerprint: {state['window_fingerprint']!r:.20}... is not the last "
                "window this run trained at that point: the data differ (another corpus, "
                "tokenizer or sampler?)"]
    return []


def _kind(value: object) -> str:
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _state_problems(saved: object, live: object, field: str) -> list[str]:
    """Where ``saved`` is not of the kind of ``live`` (a ``state_dict()`` of this run), each
    naming its field: another type (ints and floats are both numbers), a tensor of another
    dtype or shape, other keys, another length; empty when it fits."""
    if isinstance(live, Tensor):
        if not isinstance(saved, Tensor):
            return [f"{field}: {_kind(saved)}, this run's a tensor"]
        if saved.dtype != live.dtype:
            return [f"{field}: dtype {saved.dtype}, this run's {live.dtype}"]
        if saved.shape != live.shape:
            return [f"{field}: shape {tuple(saved.shape)}, this run's {tuple(live.shape)}"]
        return []
    if (isinstance(live, (int, float)) and isinstance(saved, (int, float))
            and isinstance(live, bool) == isinstance(saved, bool)):
        return []
    if isinstance(live, Mapping):  # a dict or an OrderedDict
        if not isinstance(saved, Mapping):
            return [f"{field}: {_kind(saved)}, this run's a dict"]
        if saved.keys() != live.keys():
            return [f"{field}: keys {sorted(map(str, live.keys() - saved.keys()))} missing, "
                    f"{sorted(map(str, saved.keys() - live.keys()))} unknown"]
        return [problem for key in live for problem in _state_problems(
            saved[key], live[key], f"{field}[{key!r}]")]
    if type(saved) is not type(live):
        return [f"{field}: {_kind(saved)}, this run's {_kind(live)}"]
    if isinstance(live, (list, tuple)):
        if len(saved) != len(live):
            return [f"{field}: {len(saved)} entries, this run's {len(live)}"]
        return [problem for index, (mine, theirs) in enumerate(zip(saved, live, strict=True))
                for problem in _state_problems(mine, theirs, f"{field}[{index}]")]
    return []


def _optimizer_problems(saved: object, optimizer: torch.optim.Optimizer) -> list[str]:
    """Its groups (:func:`_state_problems`), and each parameter's state: numbers, or tensors of
    its parameter's shape and dtype (``load_state_dict`` would cast another dtype)."""
    if not isinstance(saved, Mapping) or not isinstance(saved.get("state"), Mapping):
        return [f"optimizer: {_kind(saved)}, not an optimizer's state_dict"]
    problems = _state_problems(saved.get("param_groups"),
                               optimizer.state_dict()["param_groups"], "optimizer['param_groups']")
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    for index, entry in ([] if problems else saved["state"].items()):
        if not (type(index) is int and 0 <= index < len(parameters)
                and isinstance(entry, Mapping)):
            problems.append(f"optimizer: the state of parameter {index!r} is no parameter's")
            continue
        for key, value in entry.items():
            if not isinstance(value, (Tensor, int, float)) or isinstance(value, bool):
                problems.append(f"optimizer: {key} of parameter {index} is {_kind(value)}, "
                                "not a tensor or a number")
            elif isinstance(value, Tensor) and value.dim() > 0:  # not a step count
                live = parameters[index]
                for what, theirs, mine in (("shape", tuple(value.shape), tuple(live.shape)),
                                           ("dtype", value.dtype, live.dtype)):
                    if theirs != mine:
                        problems.append(f"optimizer: {key} of parameter {index} has {what} "
                                        f"{theirs}, the parameter {mine}")
                        break
    return problems


def _resume(job: _Job) -> dict | None:
    """Clear what a killed run left; with --resume, restore the checkpoint after checking
    everything it holds (and the validation records beside it); return where it resumed."""
    arguments, ctx = job.arguments, job.ctx
    if ctx.is_main:
        for directory in (arguments.checkpoint_dir, arguments.json and arguments.json.parent):
            if directory:
                directory.mkdir(parents=True, exist_ok=True)
        for path in (job.path(_CHECKPOINT), job.path(_EPOCHS_LOG), job.path(_FINAL),
                     arguments.json):  # every file the run writes, temporary first
            if path is not None:
                remove_stale_temporaries(path)
    path = job.path(_CHECKPOINT)
    if not arguments.resume:
        return None
    if not path.is_file():
        if ctx.is_main:
            print(f"no checkpoint in {arguments.checkpoint_dir}: starting from step 0",
                  flush=True)
        return None
    # to the CPU: generator states must stay CPU ByteTensors; load_state_dict copies the
    # model's tensors onto its device and the optimizer moves its state to its parameters'
    state = read_checkpoint(path, map_location="cpu")
    problems = _problems(job, state)
    if problems:
        raise CheckpointError(f"--resume: checkpoint {path} does not fit this run; nothing was "
                              "restored: " + "; ".join(problems))
    saved = _saved_records(job.path(_EPOCHS_LOG))
    job.base.load_state_dict(state["model"])
    job.optimizer.load_state_dict(state["optimizer"])
    job.scheduler.load_state_dict(state["scheduler"])
    _restretch_schedule(job)
    if job.scaler is not None:
        job.scaler.load_state_dict(state["scaler"])
    own = state["ranks"][ctx.rank]
    torch.set_rng_state(own["cpu_rng_state"])
    if "cuda_rng_state" in own:
        torch.cuda.set_rng_state(own["cuda_rng_state"])
    job.epoch, job.windows_done = state["epoch"], state["windows_done"]
    job.optimizer_steps, job.history = state["optimizer_steps"], state["history"]
    _recover_records(job, saved)
    return {"epoch": job.epoch, "window": job.windows_done,
            "optimizer_steps": job.optimizer_steps}


def _restretch_schedule(job: _Job) -> None:
    """Another ``--epochs`` than the checkpoint's run stretches or shrinks the schedule (its
    decay ends at the last optimizer step): apply the new schedule's rate from here, and say
    so, with the rate before (the restored optimizer's) and after."""
    scheduler = job.scheduler
    rates = [base * scheduler.lr_lambdas[0](scheduler.last_epoch) for base in scheduler.base_lrs]
    groups = job.optimizer.param_groups
    before = [group["lr"] for group in groups]
    if all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
           for a, b in zip(rates, before, strict=True)):
        return
    for group, rate in zip(groups, rates, strict=True):
        group["lr"] = rate
    if job.ctx.is_main:
        print(f"note: --epochs {job.arguments.epochs} changes the learning-rate schedule (its "
              f"decay ends at the last optimizer step): from step {scheduler.last_epoch} the "
              f"rate is {rates[0]:.3g}, where the checkpoint's run had {before[0]:.3g}",
              flush=True)


def _saved_records(path: Path) -> list[dict]:
    """The validation records in ``epochs.json`` (none when it is not there); refuse, naming
    the flag, one that is not the job's."""
    try:
        saved = json.loads(path.read_text()) if path.is_file() else []
        problems = (_state_problems(saved, [_RECORD] * len(saved), "records")
                    if isinstance(saved, list) else [f"{_kind(saved)}, not a list of records"])
    except (OSError, ValueError) as error:  # a UnicodeDecodeError is a ValueError too
        problems = [str(error)]
    if problems or any(type(record["epoch"]) is not int for record in saved):
        raise JobError(f"--checkpoint-dir {path.parent}: {path.name} is not the job's "
                       f"validation log ({problems[:1] or 'an epoch that is not an int'}); "
                       "move it away to resume without those records")
    return saved


def _recover_records(job: _Job, saved: list[dict]) -> None:
    """The records of the epochs the checkpoint has trained. One the run was killed before
    writing is evaluated again when the checkpoint holds that epoch's end model; any other
    missing one is named (kept as lost), never dropped in silence."""
    job.records = [record for record in saved if record["epoch"] < job.epoch]
    missing = sorted(set(range(job.epoch)) - {record["epoch"] for record in job.records})
    if missing and missing[-1] == job.epoch - 1 and job.windows_done == 0:
        if job.ctx.is_main:
            print(f"epoch {missing[-1]} has a checkpoint but no validation record: evaluating "
                  "its model again", flush=True)
        job.records.append(_evaluate(job, missing.pop()))  # the checkpoint's is its end model
        job.records.sort(key=lambda record: record["epoch"])
        if job.ctx.is_main:
            _write_json(job.path(_EPOCHS_LOG), job.records)
    if job.ctx.is_main:
        for epoch in missing:
            print(f"warning: epoch {epoch} has no validation record in "
                  f"{job.path(_EPOCHS_LOG)} and its model is gone (the checkpoint is past it)",
                  file=sys.stderr, flush=True)
    job.lost = missing


def _evaluate(job: _Job, epoch: int) -> dict[str, float]:
    """Epoch ``epoch``'s validation record: loss, accuracy and macro-F1 over the WHOLE split:
    rank r takes rows r, r + W, ... (no padding, so nothing is counted twice), gathered."""
    ctx, columns, size = job.ctx, job.validation, job.arguments.micro_batch_size
    rows = torch.arange(ctx.rank, len(columns["labels"]), ctx.world_size)
    mine = {key: column[rows].to(ctx.device) for key, column in columns.items()}
    summed = count = 0.0
    predictions = torch.zeros(0, dtype=torch.long)
    # the unwrapped module: DDP's forward would broadcast buffers, a collective that a rank
    # without validation notes would never join
    model = job.base
    if len(rows):  # fewer validation notes than ranks leaves some ranks none
        was_training = model.training
        model.eval()
        with torch.no_grad():  # in micro-batches: a whole split at 512 tokens would not fit
            for part in split_into_micro_batches(mine, micro_batch_size=size):
                part_loss, part_items = bert_classification_loss(model, part)
                summed, count = summed + float(part_loss), count + float(part_items)
        model.train(was_training)
        predictions = predict_classes(model, mine, micro_batch_size=size).cpu()
    parts = [(summed, count, predictions, mine["labels"].cpu())]
    if ctx.world_size > 1:
        parts = [None] * ctx.world_size
        dist.all_gather_object(parts, (summed, count, predictions, mine["labels"].cpu()))
    scores = classification_scores(torch.cat([p[2] for p in parts]),
                                   torch.cat([p[3] for p in parts]), len(LABELS))
    return {"epoch": epoch,
            "validation_loss": sum(p[0] for p in parts) / sum(p[1] for p in parts),
            "accuracy": scores["accuracy"], "macro_f1": scores["macro_f1"],
            "validation_samples": int(sum(p[1] for p in parts))}


def _write_json(path: Path, payload: object) -> None:
    write_atomically(path, json.dumps(payload, indent=1).encode())


def _summary(job: _Job) -> str:
    """Return the end-of-run lines: epochs, optimizer steps, effective batch, and each
    epoch's validation loss, accuracy and macro-F1 (or that its record is lost)."""
    rows = {record["epoch"]: f"{record['epoch']:5d} {record['validation_loss']:6.3f} "
                             f"{record['accuracy']:9.3f} {record['macro_f1']:9.3f}"
            for record in job.records}
    rows |= {epoch: f"{epoch:5d}   (no validation record)" for epoch in job.lost}
    return "\n".join([f"{job.epoch} epochs, {job.optimizer_steps} optimizer steps, "
                      f"effective batch {job.effective_batch}; validation after each epoch:",
                      "epoch   loss  accuracy  macro-F1", *(rows[e] for e in sorted(rows))])


def _threads() -> int:
    """Set and return the job's intra-op threads: ``OMP_NUM_THREADS`` when it is set (torchrun
    sets 1 for several processes a node), otherwise half the node's cores per process, at
    least one. torch's default, a thread per core, fights whatever else runs on the machine:
    on 2 cores beside another job, the README's command took 79 s with 1 thread and had not
    finished its first epoch after 9 min with 2."""
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cores or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")) // 2)
    torch.set_num_threads(threads)
    return threads


def _run(arguments: argparse.Namespace) -> dict:
    """Check the paths, build, resume, train, evaluate and save; return the log (complete
    on rank 0)."""
    _check_paths(arguments)
    ctx = init_distributed(arguments.timeout)
    threads = _threads()
    started = time.perf_counter()
    set_seed(arguments.seed + ctx.rank)  # torch seeds itself randomly in each new process
    job, note = _build(arguments, ctx)
    resumed_from = _resume(job)
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if ctx.is_main:
        print(f"effective batch = micro-batch {arguments.micro_batch_size} x k "
              f"{arguments.accumulation_steps} x world {ctx.world_size} = "
              f"{job.effective_batch}; {job.windows_per_epoch} optimizer steps per epoch; "
              f"{threads} thread{'s' if threads > 1 else ''} per process{note}"
              + (f"; resumed at {resumed_from} (restart {restarts})" if resumed_from else ""),
              flush=True)
    _train(job)
    if ctx.is_main:
        print(_summary(job), flush=True)
    log = {
        "world_size": ctx.world_size, "backend": ctx.backend,
        "accumulation_steps": arguments.accumulation_steps,
        "micro_batch_size": arguments.micro_batch_size,
        "effective_batch_size": job.effective_batch,
        "windows_per_epoch": job.windows_per_epoch, "restarts": restarts,
        "resumed_from": resumed_from, "steps": job.history,
        "epochs": job.records, "epochs_without_validation": job.lost,
        "allreduce_bytes": job.counter.take()["bytes"],
        "seconds": time.perf_counter() - started,
    }
    final = job.path(_FINAL)
    if ctx.is_main and final is not None:
        buffer = io.BytesIO()
        torch.save(job.base.state_dict(), buffer)
        log["final"] = str(write_atomically(final, buffer.getbuffer()))
    return log


def _written_files(arguments: argparse.Namespace) -> str:
    """Return the end-of-run lines naming each file the job writes that is there: the model,
    the logs and the checkpoint (or a line saying that nothing was saved)."""
    directory = arguments.checkpoint_dir
    files = [] if directory is None else [
        (directory / _FINAL, "the model's state_dict"),
        (directory / _EPOCHS_LOG, "each epoch's validation loss, accuracy and macro-F1"),
        (directory / _CHECKPOINT, "the last checkpoint, which --resume continues from")]
    if arguments.json:
        files.append((arguments.json, "the JSON log (the run and every optimizer step)"))
    lines = [f"wrote {path}: {what}" for path, what in files if path.is_file()]
    return "\n".join(lines) or "saved nothing (no --checkpoint-dir or --json given)"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run, write the log on rank 0, and tear the process group down."""
    arguments = parse_arguments(argv)
    try:
        with process_group_session():
            log = _run(arguments)
            main_rank = not dist.is_initialized() or dist.get_rank() == 0
            if main_rank and arguments.json:
                _write_json(arguments.json, log)
            if main_rank:
                print(_written_files(arguments), flush=True)
    except (JobError, CheckpointError) as refusal:  # every rank refuses; rank 0 says why
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {refusal}", file=sys.stderr, flush=True)
        return 2
    return 0


def _die_with_agent() -> None:
    """Under torchrun on Linux, have the kernel send this worker SIGTERM when its parent, the
    torchrun agent, dies: a killed agent (or the notebook kernel that started it) must not
    leave workers training on."""
    if "TORCHELASTIC_RUN_ID" in os.environ and sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

if __name__ == "__main__":
    _die_with_agent()
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # under torchrun, skip the interpreter's finalisation: gloo's threads can abort it
    # ("terminate called without an active exception", about one run in ten) after the work
    os._exit(code) if "TORCHELASTIC_RUN_ID" in os.environ else sys.exit(code)
