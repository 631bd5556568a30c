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
the path of every file it wrote. With
``--resume`` a (re)started job continues from the latest checkpoint in ``--checkpoint-dir``:
after torchrun restarts a lost worker's group, the run ends bit-for-bit where an uninterrupted
one would.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
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
from .checkpoints import CheckpointError
from .resume import Resumable
from .train_args import (
    AMP,
    DTYPES,
    JobError,
    check_sizes,
    parse_arguments,
    run_definition,
)
from .agent import run_worker

CHECKPOINT, EPOCHS_LOG, FINAL = "checkpoint.pt", "epochs.json", "final.pt"


class EncodedNotes(Dataset):
    """Encoded notes (``input_ids``, ``attention_mask``, ``labels``) as a map-style dataset."""

    def __init__(self, columns: dict[str, Tensor]) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns["labels"])

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {key: column[index] for key, column in self.columns.items()}


def build_model(arguments: argparse.Namespace, vocab_size: int) -> nn.Module:
    """Return the classifier: the profile's tiny BERT or a BERT-base-sized one."""
    profile = get_profile()
    sizes = ({"hidden_size": profile.bert_hidden, "num_layers": profile.bert_layers,
              "num_heads": profile.bert_heads} if arguments.model_size == "tiny" else
             {"hidden_size": 768, "num_layers": 12, "num_heads": 12})
    return make_tiny_bert(vocab_size, len(LABELS), **sizes, max_length=arguments.max_length,
                          dropout=arguments.dropout, seed=arguments.seed,
                          dtype=DTYPES[arguments.dtype])


def warmup_then_linear(optimizer: torch.optim.Optimizer, warmup_steps: int,
                       total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Return a schedule counted in OPTIMIZER steps: linear warm-up, then linear decay."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def evaluate(model: nn.Module, columns: dict[str, Tensor], ctx: DistributedContext,
             micro_batch_size: int) -> dict[str, float]:
    """Validation loss, accuracy and macro-F1 over the WHOLE split: rank r takes rows
    r, r + W, ... (no padding, so nothing is counted twice) and the results are gathered."""
    rows = torch.arange(ctx.rank, len(columns["labels"]), ctx.world_size)
    mine = {key: column[rows].to(ctx.device) for key, column in columns.items()}
    summed = count = 0.0
    predictions = torch.zeros(0, dtype=torch.long)
    if len(rows):  # fewer validation notes than ranks leaves some ranks none
        was_training = model.training
        model.eval()
        with torch.no_grad():  # in micro-batches: a whole split at 512 tokens would not fit
            for part in split_into_micro_batches(mine, micro_batch_size=micro_batch_size):
                part_loss, part_items = bert_classification_loss(model, part)
                summed, count = summed + float(part_loss), count + float(part_items)
        model.train(was_training)
        predictions = predict_classes(model, mine, micro_batch_size=micro_batch_size).cpu()
    parts = [(summed, count, predictions, mine["labels"].cpu())]
    if ctx.world_size > 1:
        parts = [None] * ctx.world_size
        dist.all_gather_object(parts, (summed, count, predictions, mine["labels"].cpu()))
    scores = classification_scores(torch.cat([p[2] for p in parts]),
                                   torch.cat([p[3] for p in parts]), len(LABELS))
    return {"validation_loss": sum(p[0] for p in parts) / sum(p[1] for p in parts),
            "accuracy": scores["accuracy"], "macro_f1": scores["macro_f1"],
            "validation_samples": int(sum(p[1] for p in parts))}


def summary(epochs_log: list[dict], optimizer_steps: int, effective_batch: int) -> str:
    """Return the end-of-run lines: epochs, optimizer steps, effective batch, and each
    epoch's validation loss, accuracy and macro-F1."""
    lines = [f"{len(epochs_log)} epochs, {optimizer_steps} optimizer steps, effective batch "
             f"{effective_batch}; validation after each epoch:",
             "epoch   loss  accuracy  macro-F1"]
    lines += [f"{e['epoch']:5d} {e['validation_loss']:6.3f} {e['accuracy']:9.3f} "
              f"{e['macro_f1']:9.3f}" for e in epochs_log]
    return "\n".join(lines)


def _atomic_json(path: Path, payload: object) -> None:
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(payload, indent=1))
    os.replace(temporary, path)


def run(arguments: argparse.Namespace) -> dict:
    """Train, evaluate and save; return the log (complete on rank 0)."""
    ctx = init_distributed(arguments.timeout)
    started = time.perf_counter()
    set_seed(arguments.seed + ctx.rank)  # torch seeds itself randomly in each new process
    corpus = load_emr_split("train")
    note = check_sizes(arguments, len(corpus), ctx.world_size)  # before anything is built
    tokenizer = load_tokenizer()
    train_records = corpus[:arguments.train_samples]
    validation_records = load_emr_split("validation")[:arguments.validation_samples]
    dataset = EncodedNotes(encode_records(train_records, tokenizer, arguments.max_length))
    validation = encode_records(validation_records, tokenizer, arguments.max_length)
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
    optimizer = torch.optim.AdamW(model.parameters(), lr=arguments.lr)
    warmup = (arguments.warmup_steps if arguments.warmup_steps is not None
              else math.ceil(arguments.epochs * windows_per_epoch / 10))
    trainer = AccumulationTrainer(
        model, bert_classification_loss, optimizer,
        accumulation_steps=arguments.accumulation_steps,
        scheduler=warmup_then_linear(optimizer, warmup, arguments.epochs * windows_per_epoch),
        max_grad_norm=arguments.max_grad_norm, amp_dtype=AMP[arguments.amp],
        progress=not arguments.no_progress and ctx.is_main)
    # checkpoints and exact resume around the engine; the flags that define the run must match
    resumable = Resumable(trainer, run=run_definition(arguments, ctx.world_size))
    effective = arguments.micro_batch_size * arguments.accumulation_steps * ctx.world_size
    directory = arguments.checkpoint_dir
    checkpoint = directory / CHECKPOINT if directory else None
    epochs_log: list[dict] = []
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    resumed_from = None
    if directory is not None and ctx.is_main:
        directory.mkdir(parents=True, exist_ok=True)
    if arguments.resume and not checkpoint.is_file() and ctx.is_main:
        print(f"no checkpoint in {directory}: starting from step 0", flush=True)
    if arguments.resume and checkpoint.is_file():
        resumable.load_checkpoint(checkpoint)
        if (directory / EPOCHS_LOG).is_file():
            epochs_log = json.loads((directory / EPOCHS_LOG).read_text())[:trainer.epoch]
        resumed_from = {"epoch": trainer.epoch, "window": trainer.windows_done,
                        "optimizer_steps": trainer.optimizer_steps}
    if ctx.is_main:
        print(f"effective batch = micro-batch {arguments.micro_batch_size} x k "
              f"{arguments.accumulation_steps} x world {ctx.world_size} = {effective}; "
              f"{windows_per_epoch} optimizer steps per epoch{note}"
              + (f"; resumed at {resumed_from} (restart {restarts})" if resumed_from else ""),
              flush=True)

    delay = arguments.window_delay
    for epoch in range(trainer.epoch, arguments.epochs):
        sampler.set_epoch(epoch)
        loader = DataLoader(dataset, batch_size=arguments.micro_batch_size, sampler=sampler)
        if delay:  # fault tests: slow windows leave time to kill a worker mid-epoch
            trainer.observers = [_Delay(delay)]
        every = arguments.checkpoint_every
        resumable.train_epoch(loader, checkpoint_path=checkpoint if every else None,
                              checkpoint_every=every)
        # the unwrapped module: DDP's forward would broadcast buffers, a collective that a
        # rank without validation notes would never join
        epochs_log.append({"epoch": epoch, **evaluate(base, validation, ctx,
                                                      arguments.micro_batch_size)})
        if checkpoint is not None:  # the epoch boundary is a resume point too
            resumable.save_checkpoint(checkpoint)
            if ctx.is_main:
                _atomic_json(directory / EPOCHS_LOG, epochs_log)
    if ctx.is_main:
        print(summary(epochs_log, trainer.optimizer_steps, effective), flush=True)
    log = {
        "world_size": ctx.world_size, "backend": ctx.backend,
        "accumulation_steps": arguments.accumulation_steps,
        "micro_batch_size": arguments.micro_batch_size, "effective_batch_size": effective,
        "windows_per_epoch": windows_per_epoch, "restarts": restarts,
        "resumed_from": resumed_from,
        "steps": [{"loss": r.loss, "lr": r.learning_rate, "grad_norm": r.grad_norm,
                   "items": r.items, "epoch": r.epoch} for r in trainer.history.records],
        "epochs": epochs_log, "allreduce_bytes": counter.take()["bytes"],
        "seconds": time.perf_counter() - started,
    }
    if ctx.is_main and directory is not None:
        final = directory / FINAL
        temporary = directory / f".{FINAL}.tmp-{os.getpid()}"
        torch.save(base.state_dict(), temporary)
        os.replace(temporary, final)
        log["final"] = str(final)
    return log


def _written_files(arguments: argparse.Namespace) -> str:
    """Return the end-of-run lines naming each file the job writes that is there: the model,
    the logs and the checkpoint (or a line saying that nothing was saved)."""
    directory = arguments.checkpoint_dir
    files = [] if directory is None else [
        (directory / FINAL, "the model's state_dict"),
        (directory / EPOCHS_LOG, "each epoch's validation loss, accuracy and macro-F1"),
        (directory / CHECKPOINT, "the last checkpoint, which --resume continues from")]
    if arguments.json:
        files.append((arguments.json, "the JSON log (the run and every optimizer step)"))
    lines = [f"wrote {path}: {what}" for path, what in files if path.is_file()]
    return "\n".join(lines) or "saved nothing (no --checkpoint-dir or --json given)"


class _Delay:
    """An observer that sleeps once per window (fault tests only)."""

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
            log = run(arguments)
            main_rank = not dist.is_initialized() or dist.get_rank() == 0
            if main_rank and arguments.json:
                arguments.json.parent.mkdir(parents=True, exist_ok=True)
                _atomic_json(arguments.json, log)
            if main_rank:
                print(_written_files(arguments), flush=True)
    except (JobError, CheckpointError) as refusal:  # every rank refuses; rank 0 says why
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {refusal}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    run_worker(main)
