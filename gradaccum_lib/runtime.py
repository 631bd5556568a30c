"""Device choice, seeding, determinism and the size profile (``GRADACCUM_PROFILE``)."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "PROFILES",
    "Profile",
    "check_positive_int",
    "choose_device",
    "get_profile",
    "is_int",
    "make_generator",
    "make_deterministic",
    "set_seed",
]


@dataclass(frozen=True)
class Profile:
    """Problem sizes for the notebooks: ``ci`` runs every notebook in well under a minute on
    2 CPU cores, ``cpu`` is a laptop session, ``gpu`` is for real hardware.
    """

    name: str
    num_samples: int  # samples in the demonstration batch of the math notebook
    input_dim: int
    hidden_dim: int
    num_classes: int
    sequence_length: int  # longest sequence of the token-level demonstrations
    vocab_size: int  # vocabulary of the toy token models
    dropout_draws: int  # random draws averaged to show "equal in expectation"
    effective_batch_size: int  # samples per optimizer step in the single-device experiments
    wide_hidden_dim: int  # width of the MLP whose memory and speed are measured
    train_samples: int  # training set of the curves experiment
    train_epochs: int
    timing_repeats: int  # interleaved repeats per timing (medians are reported)
    max_length: int  # tokens per EMR note (truncated / padded)
    bert_hidden: int  # tiny BERT: hidden size, layers, heads
    bert_layers: int
    bert_heads: int
    emr_train_notes: int  # EMR notes used for training in the case study
    emr_epochs: int


PROFILES: dict[str, Profile] = {
    "ci": Profile("ci", 64, 16, 32, 4, 24, 50, 200, 256, 512, 200, 5, 5,
                  128, 64, 2, 2, 2000, 8),
    "cpu": Profile("cpu", 256, 32, 64, 4, 48, 200, 1000, 512, 1024, 1000, 8, 9,
                   256, 128, 2, 4, 2000, 8),
    "gpu": Profile("gpu", 4096, 128, 512, 8, 256, 5000, 4000, 4096, 4096, 8200, 20, 15,
                   512, 256, 4, 4, 2000, 20),
}


def get_profile(name: str | None = None) -> Profile:
    """Return the profile named ``name``, else ``$GRADACCUM_PROFILE``, else ``gpu`` when CUDA is
    present and ``cpu`` otherwise.
    """
    if name is None:
        name = os.environ.get("GRADACCUM_PROFILE") or (
            "gpu" if torch.cuda.is_available() else "cpu"
        )
    if name not in PROFILES:
        raise ValueError(
            f"profile must be one of {sorted(PROFILES)} (argument or GRADACCUM_PROFILE); "
            f"got {name!r}"
        )
    return PROFILES[name]


def choose_device(preferred: str | None = None) -> torch.device:
    """Return ``preferred`` if given, else the best available device: cuda > mps > cpu."""
    if preferred is not None:
        return torch.device(preferred)
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def set_seed(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (all devices') global generators with ``seed``."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int; got {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """Return a fresh ``torch.Generator`` on ``device`` seeded with ``seed``."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int; got {seed!r}")
    return torch.Generator(device=device).manual_seed(seed)


def make_deterministic(threads: int | None = 1) -> None:
    """Use deterministic algorithms (and ``threads`` intra-op threads unless None)."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    if threads is not None:
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive int or None; got {threads!r}")
        torch.set_num_threads(threads)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def is_int(value: object) -> bool:
    """Return True for an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive_int(label: str, value: object) -> int:
    """Return ``value`` if it is an int >= 1 (bools refused), else raise a ValueError that
    names ``label`` and the value."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{label} must be a positive int; got {value!r}")
    return value
