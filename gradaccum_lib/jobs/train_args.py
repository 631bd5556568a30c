"""The training job's command line: its flags, the checks of its sizes against the data (made
before anything is built or written), and the flags that define a run, which its checkpoints
carry (a resume with any of them changed is refused, naming the flag).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ..runtime import get_profile

__all__ = ["AMP", "DTYPES", "JobError", "check_sizes", "parse_arguments", "run_definition"]

_MODEL_SIZES = ("tiny", "base")
AMP = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPES = {"float32": torch.float32, "float64": torch.float64}


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
    add("--amp", choices=tuple(AMP), default="none",
        help="autocast: bf16 (CPU or GPU) or fp16 with GradScaler (CUDA only)")
    add("--dtype", choices=tuple(DTYPES), default="float32",
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


def run_definition(arguments: argparse.Namespace, world_size: int) -> dict[str, object]:
    """Return ``{"--flag": value}`` for the flags that define the run, and the world size."""
    return {**{"--" + name.replace("_", "-"): getattr(arguments, name) for name in _RUN_FLAGS},
            "world size": world_size}


def check_sizes(arguments: argparse.Namespace, corpus_size: int, world_size: int) -> str:
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
