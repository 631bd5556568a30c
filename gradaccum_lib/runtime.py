"""Device choice, seeding, determinism and the size profile (``GRADACCUM_PROFILE``)."""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import random
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "Profile",
    "check_bool",
    "check_choice",
    "check_int",
    "check_model",
    "check_number",
    "check_positive_int",
    "check_seed",
    "choose_device",
    "describe_profile",
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
    #: random draws averaged to show "equal in expectation"; 01 runs them on one CPU thread in
    #: float64 whatever the profile, each draw over num_samples (so gpu's is not larger: 4,000
    #: draws of 4,096 samples ran past 400 s on an H200 machine)
    dropout_draws: int
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
    emr_lr: float  # AdamW's peak learning rate for the case study (a wider model needs less)


_PROFILES: dict[str, Profile] = {
    "ci": Profile("ci", 64, 16, 32, 4, 24, 50, 200, 256, 512, 200, 5, 5,
                  128, 64, 2, 2, 2000, 8, 3e-3),
    "cpu": Profile("cpu", 256, 32, 64, 4, 48, 200, 1000, 512, 1024, 1000, 8, 9,
                   256, 128, 2, 4, 2000, 8, 1e-3),
    "gpu": Profile("gpu", 4096, 128, 512, 8, 256, 5000, 250, 4096, 4096, 8200, 20, 15,
                   512, 256, 4, 4, 2000, 20, 1e-3),
}


def get_profile(name: str | None = None) -> Profile:
    """Return the profile named ``name``, else ``$GRADACCUM_PROFILE``, else ``gpu`` when CUDA is
    present and ``cpu`` otherwise.
    """
    if name is None:
        name = os.environ.get("GRADACCUM_PROFILE") or (
            "gpu" if torch.cuda.is_available() else "cpu"
        )
    if not isinstance(name, str) or name not in _PROFILES:
        raise ValueError(
            f"profile must be one of {sorted(_PROFILES)} (argument or GRADACCUM_PROFILE); "
            f"got {name!r}"
        )
    return _PROFILES[name]


def describe_profile(profile: Profile, *fields: str) -> str:
    """Return one line naming the active profile and the sizes ``fields`` it sets (all of them
    when none are named): what a notebook's first cell prints."""
    if not isinstance(profile, Profile):
        raise TypeError(f"profile must be a Profile (from get_profile()); got "
                        f"{type(profile).__name__}")
    known = [f.name for f in dataclasses.fields(Profile) if f.name != "name"]
    unknown = [field for field in fields if field not in known]
    if unknown:
        raise ValueError(f"a Profile has no field {unknown[0]!r}; fields: {known}")
    sizes = ", ".join(f"{field}={getattr(profile, field)}" for field in (fields or known))
    role = {"ci": "the committed outputs' sizes", "cpu": "a laptop session's sizes",
            "gpu": "sizes for real hardware"}[profile.name]
    return f"GRADACCUM_PROFILE={profile.name} ({role}; ci | cpu | gpu): {sizes}"


def _device(label: str, device: object) -> torch.device:
    """``device`` as a ``torch.device``, or a ValueError/TypeError naming ``label``."""
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"{label} must be a device name such as 'cpu', 'cuda' or 'cuda:1', or a "
                        f"torch.device; got {device!r} of type {type(device).__name__}")
    try:
        return torch.device(device)
    except RuntimeError:
        raise ValueError(f"{label} must be a device name such as 'cpu', 'cuda', 'cuda:1' or "
                         f"'mps'; got {device!r}") from None


def choose_device(preferred: str | None = None) -> torch.device:
    """Return ``preferred`` if given, else the best available device: cuda > mps > cpu."""
    if preferred is not None:
        device = _device("preferred", preferred)
        mps = getattr(torch.backends, "mps", None)
        available = {"cuda": torch.cuda.is_available(),
                     "mps": mps is not None and mps.is_available()}
        missing_index = (device.type == "cuda" and device.index is not None
                         and device.index >= torch.cuda.device_count())
        if not available.get(device.type, True) or missing_index:
            raise ValueError(f"preferred device {preferred!r} is not available on this machine; "
                             "pass None to choose the best available one")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def check_seed(seed: object, label: str = "seed") -> int:
    """Return ``seed`` if it is an int in [0, 2**64) (what torch accepts), else raise."""
    if not is_int(seed) or not 0 <= seed < 2**64:
        raise ValueError(f"{label} must be a non-negative int; got {seed!r} (accepted: "
                         "0 <= seed < 2**64)")
    return seed


def set_seed(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (all devices') global generators with ``seed``."""
    check_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """Return a fresh ``torch.Generator`` on ``device`` seeded with ``seed``."""
    check_seed(seed)
    device = _device("device", device)
    try:
        return torch.Generator(device=device).manual_seed(seed)
    except RuntimeError as error:
        raise ValueError(f"device {device} cannot hold a generator here: {error}") from None


def make_deterministic(threads: int | None = 1) -> None:
    """Use deterministic algorithms (and ``threads`` intra-op threads unless None)."""
    if threads is not None and (not is_int(threads) or threads < 1):
        raise ValueError(f"threads must be a positive int or None; got {threads!r}")
    torch.use_deterministic_algorithms(True, warn_only=True)
    if threads is not None:
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


def check_int(label: str, value: object, *, low: int | None = None,
              high: int | None = None) -> int:
    """Return ``value`` if it is an int (not a bool) in [low, high]; else a TypeError (wrong
    type) or ValueError (out of range) naming ``label``, the value and the range."""
    bounds = " ".join(part for part in (
        f">= {low}" if low is not None and high is None else "",
        f"<= {high}" if high is not None and low is None else "",
        f"in [{low}, {high}]" if low is not None and high is not None else "") if part)
    accepted = f"an int {bounds}".rstrip()
    if not is_int(value):
        raise TypeError(f"{label} must be {accepted}; got {value!r} of type "
                        f"{type(value).__name__}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{label} must be {accepted}; got {value!r}")
    return value


def check_number(label: str, value: object, *, low: float | None = None,
                 high: float | None = None, low_open: bool = False,
                 high_open: bool = False) -> float:
    """Return ``value`` as a float if it is a real number (bools and strings refused), finite,
    and within the bounds (``*_open``: the bound itself is excluded); else a TypeError or
    ValueError naming ``label``, the value and the accepted range."""
    if low is not None and high is not None:
        accepted = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    elif low is not None:
        accepted = f"{'>' if low_open else '>='} {low}"
    elif high is not None:
        accepted = f"{'<' if high_open else '<='} {high}"
    else:
        accepted = ""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{label} must be a number {accepted}".rstrip()
                        + f"; got {value!r} of type {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{label} must be a finite number {accepted}".rstrip()
                         + f"; got {value!r}")
    if ((low is not None and (number < low or (low_open and number == low)))
            or (high is not None and (number > high or (high_open and number == high)))):
        raise ValueError(f"{label} must be {accepted}; got {value!r}")
    return number


def check_bool(label: str, value: object) -> bool:
    """Return ``value`` if it is True or False, else a TypeError naming ``label``."""
    if not isinstance(value, bool):
        raise TypeError(f"{label} must be True or False; got {value!r} of type "
                        f"{type(value).__name__}")
    return value


def check_choice(label: str, value: object, choices: Collection[str]) -> str:
    """Return ``value`` if it is one of ``choices`` (strings), else a ValueError listing them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{label} must be one of {sorted(choices)}; got {value!r}")
    return value


def check_model(model: object) -> None:
    """Raise unless ``model`` is an ``nn.Module`` with trainable parameters, all of one dtype
    (the loop and the ground truth both refuse a mix, naming two parameters)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    trainable = False  # one pass over the parameters: the loop calls this every window
    dtypes: dict[torch.dtype, str] = {}
    for name, parameter in model.named_parameters():
        trainable = trainable or parameter.requires_grad
        dtypes.setdefault(parameter.dtype, name)
    if not trainable:
        raise ValueError(f"model ({type(model).__name__}) has no trainable parameters; "
                         "there is nothing to accumulate")
    if len(dtypes) > 1:
        (first, first_name), (second, second_name) = list(dtypes.items())[:2]
        raise ValueError(
            f"model's parameters have mixed dtypes ({first_name!r} is {first}, {second_name!r} "
            f"is {second}); cast the model to one dtype (e.g. model.float()) and use "
            "autocast_dtype for lower-precision compute")
