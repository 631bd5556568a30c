"""The EMR case study as a job: fine-tune a BERT classifier with accumulation, anywhere.

    python -m gradaccum_lib.jobs.train --accumulation-steps 4 --micro-batch-size 8 \\
        --checkpoint-dir build/run --resume --json build/run/log.json
    torchrun --standalone --nproc_per_node=2 --max-restarts=1 -m gradaccum_lib.jobs.train ...

The same command runs as one process or under ``torchrun`` (gloo on CPU, nccl on CUDA), on
one node or several. Every rank trains its ``DistributedSampler`` shard of the shipped EMR
corpus (``set_epoch`` each epoch) with :class:`AccumulationTrainer`; rank 0 shows a progress
bar, writes atomic checkpoints every ``--checkpoint-every`` windows and at each epoch's end,
evaluates the whole validation split after each epoch (gathered across ranks, no sample
counted twice), writes ``final.pt`` (the model's ``state_dict``) and the JSON log, and prints
the path of every file it wrote. Its command line comes first below (the flags, the sizes
checked against the data before anything is built, the flags that define a run). With
``--resume`` a (re)started job continues from the latest checkpoint in ``--checkpoint-dir``:
after torchrun restarts a lost worker's group, the run ends bit-for-bit where an uninterrupted
one would. Every start first removes the temporaries a killed run left beside the job's files;
a resume whose checkpoint holds an epoch's end model but not its validation record evaluates
that epoch again, and a record that cannot be recovered is named, never dropped in silence.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ..accumulation import AccumulationTrainer
from ..batches import split_into_micro_batches
from ..distributed import DistributedContext, init_distributed, process_group_session
from ..losses import bert_classification_loss
from ..measure.comm import CommCounter
from ..measure.metrics import classification_scores, predict_classes
from ..runtime import get_profile, set_seed
from ..workloads.data import encode_records, load_emr_split, load_tokenizer
from ..workloads.emr_corpus import LABELS
from ..workloads.models import make_tiny_bert
from .agent import run_worker
from .checkpoints import CheckpointError, remove_stale_temporaries, write_atomically
from .resume import Resumable

__all__ = ["JobError", "build_model", "main", "parse_arguments"]


# The command line: its flags, the checks of its sizes against the data (made before anything
# is built or written), and the flags that define a run, which its checkpoints carry (a resume
# with any of them changed is refused, naming the flag). ----------------------------------------

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


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Return the command line parsed and checked (argparse errors for bad flags)."""
    parser = argparse.ArgumentParser(prog="python -m gradaccum_lib.jobs.train",
                                     description=__doc__.split("\n\n")[0])
    _add_run_flags(parser.add_argument)
    _add_job_flags(parser.add_argument)
    arguments = parser.parse_args(argv)
    if not 0.0 <= arguments.dropout < 1.0:
        parser.error(f"--dropout must be in [0, 1); got {arguments.dropout}")
    if arguments.max_length > 512:
        parser.error(f"--max-length must be at most 512 (BERT's positions); got "
                     f"{arguments.max_length}")
    if arguments.max_length < 3:
        parser.error("--max-length must be at least 3 ([CLS], a token, [SEP])")
    if (arguments.checkpoint_every or arguments.resume) and arguments.checkpoint_dir is None:
        parser.error("--checkpoint-every and --resume need --checkpoint-dir")
    if arguments.checkpoint_dir is not None and arguments.checkpoint_dir.exists() and (
            not arguments.checkpoint_dir.is_dir()):
        parser.error(f"--checkpoint-dir {arguments.checkpoint_dir} is a file, not a folder")
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
             "accumulation_steps", "train_samples", "drop_last", "seed", "lr", "warmup_steps",
             "max_grad_norm", "amp")


class JobError(ValueError):
    """A refusal of the job's arguments, printed as one line (no traceback) with exit code 2."""


def _run_definition(arguments: argparse.Namespace, world_size: int) -> dict[str, object]:
    """Return ``{"--flag": value}`` for the flags that define the run, and the world size."""
    return {**{"--" + name.replace("_", "-"): getattr(arguments, name) for name in _RUN_FLAGS},
            "world size": world_size}


def _check_sizes(arguments: argparse.Namespace, corpus_size: int, world_size: int) -> str:
    """Refuse sizes that cannot be meant (:class:`JobError`, naming the numbers); return a note
    for the start line when the sampler repeats or drops samples to even the ranks out."""
    samples = arguments.train_samples or corpus_size
    if samples > corpus_size:
        raise JobError(f"--train-samples {samples} is more than the train split's "
                       f"{corpus_size} notes")
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


# The job. ----------------------------------------------------------------------------------

_CHECKPOINT, _EPOCHS_LOG, _FINAL = "checkpoint.pt", "epochs.json", "final.pt"


class _EncodedNotes(Dataset):
    """Encoded notes (``input_ids``, ``attention_mask``, ``labels``) as a map-style dataset."""

    def __init__(self, columns: dict[str, Tensor]) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns["labels"])

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {key: column[index] for key, column in self.columns.items()}


@dataclass
class _Job:
    """What the job's steps share: its flags, the process group, the data, the model (``base``
    unwrapped, ``model`` as trained) and the trainer with its checkpoints."""

    arguments: argparse.Namespace
    ctx: DistributedContext
    dataset: _EncodedNotes
    validation: dict[str, Tensor]
    base: nn.Module
    counter: CommCounter
    sampler: DistributedSampler
    windows_per_epoch: int
    resumable: Resumable

    @property
    def trainer(self) -> AccumulationTrainer:
        return self.resumable.trainer

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
    """Check the sizes (before anything is built), encode the data, build the model, the
    sampler and the trainer; return the job and the start line's note on uneven ranks."""
    corpus = load_emr_split("train")
    note = _check_sizes(arguments, len(corpus), ctx.world_size)
    tokenizer = load_tokenizer()
    dataset = _EncodedNotes(encode_records(corpus[:arguments.train_samples], tokenizer,
                                           arguments.max_length))
    validation = encode_records(load_emr_split("validation")[:arguments.validation_samples],
                                tokenizer, arguments.max_length)
    base = build_model(arguments, len(tokenizer)).to(ctx.device)
    counter = CommCounter()
    model: nn.Module = base
    if ctx.world_size > 1:
        # .grad as views into DDP's buckets: no second copy of the gradients (measured in 00)
        model = DistributedDataParallel(base, gradient_as_bucket_view=True)
        counter.register(model)
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank,
                                 shuffle=True, seed=arguments.seed,
                                 drop_last=arguments.drop_last)
    windows_per_epoch = -(-len(sampler) // (arguments.micro_batch_size
                                            * arguments.accumulation_steps))
    trainer = _trainer(arguments, ctx, model, windows_per_epoch)
    # checkpoints and exact resume around the engine; the flags that define the run must match
    resumable = Resumable(trainer, run=_run_definition(arguments, ctx.world_size))
    return _Job(arguments, ctx, dataset, validation, base, counter, sampler, windows_per_epoch,
                resumable), note


def _trainer(arguments: argparse.Namespace, ctx: DistributedContext, model: nn.Module,
             windows_per_epoch: int) -> AccumulationTrainer:
    """AdamW, its warm-up-then-linear schedule over the whole run, and the engine."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=arguments.lr)
    total = arguments.epochs * windows_per_epoch
    warmup = (arguments.warmup_steps if arguments.warmup_steps is not None
              else math.ceil(total / 10))
    return AccumulationTrainer(
        model, bert_classification_loss, optimizer,
        accumulation_steps=arguments.accumulation_steps,
        scheduler=_warmup_then_linear(optimizer, warmup, total),
        max_grad_norm=arguments.max_grad_norm, amp_dtype=_AMP[arguments.amp],
        progress=not arguments.no_progress and ctx.is_main,
        observers=[_Delay(arguments.window_delay)] if arguments.window_delay else [])


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


def _start(job: _Job) -> tuple[list[dict], list[int], dict | None]:
    """Clear what a killed run left, then resume from the checkpoint when asked; return the
    validation records so far, the epochs whose record is lost, and where the run resumed."""
    arguments, ctx = job.arguments, job.ctx
    if ctx.is_main:
        if arguments.checkpoint_dir is not None:
            arguments.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        for path in (job.path(_CHECKPOINT), job.path(_EPOCHS_LOG), job.path(_FINAL),
                     arguments.json):  # every file the run writes, temporary first
            if path is not None:
                remove_stale_temporaries(path)
    checkpoint = job.path(_CHECKPOINT)
    if not arguments.resume:
        return [], [], None
    if not checkpoint.is_file():
        if ctx.is_main:
            print(f"no checkpoint in {arguments.checkpoint_dir}: starting from step 0",
                  flush=True)
        return [], [], None
    job.resumable.load_checkpoint(checkpoint)
    trainer = job.trainer
    records, lost = _validation_records(job)
    return records, lost, {"epoch": trainer.epoch, "window": trainer.windows_done,
                           "optimizer_steps": trainer.optimizer_steps}


def _validation_records(job: _Job) -> tuple[list[dict], list[int]]:
    """The records of the epochs the checkpoint has trained. One the run was killed before
    writing is evaluated again when the checkpoint holds that epoch's end model; any other
    missing one is named (returned as lost), never dropped in silence."""
    path, trainer = job.path(_EPOCHS_LOG), job.trainer
    saved = json.loads(path.read_text()) if path.is_file() else []
    records = [record for record in saved if record["epoch"] < trainer.epoch]
    missing = sorted(set(range(trainer.epoch)) - {record["epoch"] for record in records})
    if missing and missing[-1] == trainer.epoch - 1 and trainer.windows_done == 0:
        if job.ctx.is_main:
            print(f"epoch {missing[-1]} has a checkpoint but no validation record: evaluating "
                  "its model again", flush=True)
        records.append(_evaluate(job, missing.pop()))  # the checkpoint's is its end model
        records.sort(key=lambda record: record["epoch"])
        if job.ctx.is_main:
            _write_json(path, records)
    if job.ctx.is_main:
        for epoch in missing:
            print(f"warning: epoch {epoch} has no validation record in {path} and its model "
                  "is gone (the checkpoint is past it)", file=sys.stderr, flush=True)
    return records, missing


def _train_epochs(job: _Job, records: list[dict]) -> None:
    """Train the remaining epochs; after each, its validation record, written before the
    epoch-end checkpoint (a kill between the two resumes before the record and redoes it)."""
    arguments, trainer = job.arguments, job.trainer
    checkpoint, every = job.path(_CHECKPOINT), arguments.checkpoint_every
    for epoch in range(trainer.epoch, arguments.epochs):
        job.sampler.set_epoch(epoch)
        loader = DataLoader(job.dataset, batch_size=arguments.micro_batch_size,
                            sampler=job.sampler)
        job.resumable.train_epoch(loader, checkpoint_path=checkpoint if every else None,
                                  checkpoint_every=every)
        records.append(_evaluate(job, epoch))
        if checkpoint is not None:  # the epoch boundary is a resume point too
            if job.ctx.is_main:
                _write_json(job.path(_EPOCHS_LOG), records)
            job.resumable.save_checkpoint(checkpoint)


def _summary(job: _Job, records: list[dict], lost: list[int]) -> str:
    """Return the end-of-run lines: epochs, optimizer steps, effective batch, and each
    epoch's validation loss, accuracy and macro-F1 (or that its record is lost)."""
    trainer = job.trainer
    rows = {record["epoch"]: f"{record['epoch']:5d} {record['validation_loss']:6.3f} "
                             f"{record['accuracy']:9.3f} {record['macro_f1']:9.3f}"
            for record in records}
    rows |= {epoch: f"{epoch:5d}   (no validation record)" for epoch in lost}
    return "\n".join([f"{trainer.epoch} epochs, {trainer.optimizer_steps} optimizer steps, "
                      f"effective batch {job.effective_batch}; validation after each epoch:",
                      "epoch   loss  accuracy  macro-F1", *(rows[e] for e in sorted(rows))])


def _run(arguments: argparse.Namespace) -> dict:
    """Train, evaluate and save; return the log (complete on rank 0)."""
    ctx = init_distributed(arguments.timeout)
    started = time.perf_counter()
    set_seed(arguments.seed + ctx.rank)  # torch seeds itself randomly in each new process
    job, note = _build(arguments, ctx)
    records, lost, resumed_from = _start(job)
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if ctx.is_main:
        print(f"effective batch = micro-batch {arguments.micro_batch_size} x k "
              f"{arguments.accumulation_steps} x world {ctx.world_size} = "
              f"{job.effective_batch}; {job.windows_per_epoch} optimizer steps per epoch{note}"
              + (f"; resumed at {resumed_from} (restart {restarts})" if resumed_from else ""),
              flush=True)
    _train_epochs(job, records)
    if ctx.is_main:
        print(_summary(job, records, lost), flush=True)
    log = {
        "world_size": ctx.world_size, "backend": ctx.backend,
        "accumulation_steps": arguments.accumulation_steps,
        "micro_batch_size": arguments.micro_batch_size,
        "effective_batch_size": job.effective_batch,
        "windows_per_epoch": job.windows_per_epoch, "restarts": restarts,
        "resumed_from": resumed_from,
        "steps": [{"loss": r.loss, "lr": r.learning_rate, "grad_norm": r.grad_norm,
                   "items": r.items, "epoch": r.epoch} for r in job.trainer.history.records],
        "epochs": records, "epochs_without_validation": lost,
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


class _Delay:
    """An observer that sleeps at the end of every window: ``--window-delay``, for the fault
    tests only. It is the honest way to kill a worker mid-epoch: the tests' tiny job trains an
    epoch in well under a second, too fast to aim a kill between two checkpoints."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_micro_step(self, *_: object) -> None:
        """Do nothing per micro-step."""

    def on_window_end(self, *_: object) -> None:
        """Sleep at the end of every window."""
        time.sleep(self.seconds)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run, write the log on rank 0, and tear the process group down."""
    arguments = parse_arguments(argv)
    try:
        with process_group_session():
            log = _run(arguments)
            main_rank = not dist.is_initialized() or dist.get_rank() == 0
            if main_rank and arguments.json:
                arguments.json.parent.mkdir(parents=True, exist_ok=True)
                _write_json(arguments.json, log)
            if main_rank:
                print(_written_files(arguments), flush=True)
    except (JobError, CheckpointError) as refusal:  # every rank refuses; rank 0 says why
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {refusal}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    run_worker(main)
