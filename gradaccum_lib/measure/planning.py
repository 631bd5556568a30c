"""Planning: time x memory models of accumulation, on one device and on a data-parallel
cluster.

- :class:`StepTimeModel` / :func:`fit_step_time`: a window's time from measured micro-step times;
- :class:`DdpStepModel` / :func:`fit_ddp_step_model`: a DDP step with one sync per window or
  one per micro-step, fitted to the medians of step times measured interleaved (notebook 06 §5 runs
  ``gradaccum_course/programs/beyond_step_times.py``);
- :func:`plan_accumulation`, :func:`max_micro_batch_size`, :func:`accumulation_steps_for`:
  choosing the micro-batch and k on one device;
- :class:`_TransformerActivations` / :func:`fit_transformer_activations`: activation bytes as a
  function of sequence length and layer count, fitted exactly to measurements;
- :func:`measure_bert_shape`: a BERT family's parameter counts and MEASURED activation model;
- :func:`plan_cluster`: per-device memory and the effective batch of micro x k x devices.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from fractions import Fraction

import torch
from torch import nn

from gradaccum_lib.runtime import check_int, check_number, check_positive_int, is_int

from .memory import MemoryBreakdown, Optimizer, Precision, activation_bytes, memory_budget

__all__ = [
    "accumulation_steps_for",
    "AccumulationPlan",
    "ClusterPlan",
    "DdpStepModel",
    "ddp_relative_residuals",
    "fit_ddp_step_model",
    "fit_step_time",
    "fit_transformer_activations",
    "max_micro_batch_size",
    "measure_bert_shape",
    "plan_accumulation",
    "plan_cluster",
    "StepTimeModel",
    "TransformerShape",
]


def _check_seconds(model: object) -> None:
    """Every field of a time model: a finite number of seconds >= 0."""
    for field in fields(model):
        check_number(f"{type(model).__name__}.{field.name}", getattr(model, field.name), low=0)


def _measurements(label: str, values: object, *, sizes: bool = False) -> list[float]:
    """A sequence of measured seconds (finite, >= 0) or of sizes (positive ints)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{label} must be a list of {'ints' if sizes else 'numbers'}; got "
                        f"{type(values).__name__}")
    for index, value in enumerate(values):
        if sizes:
            check_positive_int(f"{label}[{index}]", value)
        else:
            check_number(f"{label}[{index}]", value, low=0)
    return [float(value) for value in values]


@dataclass(frozen=True)
class StepTimeModel:
    """Time of a window: ``k * (overhead_per_micro_step + b * seconds_per_sample)
    + seconds_per_optimizer_step`` for k micro-batches of b samples.
    """

    overhead_per_micro_step: float
    seconds_per_sample: float
    seconds_per_optimizer_step: float = 0.0

    def __post_init__(self) -> None:
        _check_seconds(self)

    def window_seconds(self, micro_batch_size: int, accumulation_steps: int) -> float:
        """Return the modelled seconds of one window (one optimizer step)."""
        check_positive_int("micro_batch_size", micro_batch_size)
        check_positive_int("accumulation_steps", accumulation_steps)
        per_micro_step = self.overhead_per_micro_step + micro_batch_size * self.seconds_per_sample
        return accumulation_steps * per_micro_step + self.seconds_per_optimizer_step


def fit_step_time(
    micro_batch_sizes: Sequence[int],
    seconds_per_micro_step: Sequence[float],
    *,
    seconds_per_optimizer_step: float = 0.0,
) -> StepTimeModel:
    """Return the least-squares line ``seconds = overhead + size * per_sample`` through the
    measured forward+backward times (both coefficients clipped at 0).
    """
    sizes = _measurements("micro_batch_sizes", micro_batch_sizes, sizes=True)
    seconds = _measurements("seconds_per_micro_step", seconds_per_micro_step)
    check_number("seconds_per_optimizer_step", seconds_per_optimizer_step, low=0)
    if len(sizes) != len(seconds) or len(sizes) < 2:
        raise ValueError("need at least two (micro_batch_size, seconds) pairs of equal length; "
                         f"got {len(sizes)} micro_batch_sizes and {len(seconds)} "
                         "seconds_per_micro_step")
    sizes = torch.tensor(sizes, dtype=torch.float64)
    seconds = torch.tensor(seconds, dtype=torch.float64)
    if bool((sizes == sizes[0]).all()):
        raise ValueError("micro_batch_sizes must not all be equal")
    design = torch.stack([torch.ones_like(sizes), sizes], dim=1)
    overhead, per_sample = torch.linalg.lstsq(design, seconds[:, None]).solution[:, 0].tolist()
    return StepTimeModel(max(overhead, 0.0), max(per_sample, 0.0), seconds_per_optimizer_step)


@dataclass(frozen=True)
class DdpStepModel:
    """Time of one data-parallel optimizer step with k micro-steps:
    ``k * compute_per_micro_step + syncs * comm_per_sync + per_step`` where syncs is 1 when
    gradients are synchronised once per window and k when every micro-step synchronises.
    ``comm_per_sync`` is the part of an all-reduce that compute does not hide.
    """

    compute_per_micro_step: float
    comm_per_sync: float
    per_step: float = 0.0

    def __post_init__(self) -> None:
        _check_seconds(self)

    @classmethod
    def from_comm_share(cls, compute_per_micro_step: float, comm_share: float) -> DdpStepModel:
        """Return the model of a cluster where, at k = 1, communication takes ``comm_share``
        of the step (e.g. 0.6: 60%)."""
        check_number("comm_share", comm_share, low=0, high=1, high_open=True)
        check_number("compute_per_micro_step", compute_per_micro_step, low=0, low_open=True)
        return cls(compute_per_micro_step,
                   compute_per_micro_step * comm_share / (1.0 - comm_share))

    def step_seconds(self, accumulation_steps: int, sync: str = "window") -> float:
        """Return the modelled seconds of one optimizer step."""
        if sync not in ("window", "every"):
            raise ValueError(f"sync must be 'window' or 'every'; got {sync!r}")
        check_positive_int("accumulation_steps", accumulation_steps)
        syncs = 1 if sync == "window" else accumulation_steps
        return (accumulation_steps * self.compute_per_micro_step + syncs * self.comm_per_sync
                + self.per_step)

    def comm_fraction(self, accumulation_steps: int, sync: str = "window") -> float:
        """Return the share of the step spent in (unhidden) communication."""
        seconds = self.step_seconds(accumulation_steps, sync)  # checks the arguments
        if seconds == 0:
            raise ValueError("the modelled step takes 0 seconds; there is no share to take")
        syncs = 1 if sync == "window" else accumulation_steps
        return syncs * self.comm_per_sync / seconds


def _nonnegative_least_squares(design: torch.Tensor, targets: torch.Tensor) -> list[float]:
    """Return the x >= 0 that minimises |design x - targets| (exact: the best least-squares
    solution over every subset of free columns whose solution is >= 0; few columns only)."""
    columns = design.shape[1]
    best, best_residual = [0.0] * columns, float(targets.square().sum())
    for size in range(1, columns + 1):
        for free in itertools.combinations(range(columns), size):
            solution = torch.linalg.lstsq(design[:, free], targets[:, None]).solution[:, 0]
            if bool((solution < 0).any()):
                continue
            residual = float((design[:, free] @ solution - targets).square().sum())
            if residual < best_residual:
                best, best_residual = [0.0] * columns, residual
                for column, value in zip(free, solution.tolist(), strict=True):
                    best[column] = value
    return best


def _ddp_times(accumulation_steps: object, window_seconds: object, every_seconds: object
               ) -> list[tuple[int, str, float]]:
    """Checked (k, sync, seconds) rows of measured DDP step times (all > 0)."""
    _measurements("accumulation_steps", accumulation_steps, sizes=True)
    for label, values in (("window_seconds", window_seconds), ("every_seconds", every_seconds)):
        _measurements(label, values)
        for index, value in enumerate(values):
            check_number(f"{label}[{index}]", value, low=0, low_open=True)
    if not len(accumulation_steps) == len(window_seconds) == len(every_seconds) >= 2:
        raise ValueError("need at least two k values, each with a window and an every time; got "
                         f"{len(accumulation_steps)} accumulation_steps, {len(window_seconds)} "
                         f"window_seconds and {len(every_seconds)} every_seconds")
    return [row for k, window, every in zip(accumulation_steps, window_seconds, every_seconds,
                                            strict=True)
            for row in ((k, "window", float(window)), (k, "every", float(every)))]


def fit_ddp_step_model(
    accumulation_steps: Sequence[int],
    window_seconds: Sequence[float],
    every_seconds: Sequence[float],
) -> DdpStepModel:
    """Return the :class:`DdpStepModel` (every term >= 0) closest to measured step times
    (e.g. medians from the step-time program notebook 06 runs) with one sync per
    window (``k c + m + o``) and one per micro-step (``k c + k m + o``), in relative terms:
    least squares of
    ``(model - measured) / measured``, so that short and long steps weigh alike.
    """
    rows = _ddp_times(accumulation_steps, window_seconds, every_seconds)
    design = torch.tensor([[float(k), float(k if sync == "every" else 1), 1.0]
                           for k, sync, _ in rows], dtype=torch.float64)
    if torch.linalg.matrix_rank(design) < 3:
        raise ValueError("the k values must differ (at least one k > 1) to separate the terms")
    seconds = torch.tensor([value for _, _, value in rows], dtype=torch.float64)
    compute, comm, per_step = _nonnegative_least_squares(design / seconds[:, None],
                                                        torch.ones_like(seconds))
    return DdpStepModel(compute, comm, per_step)


def ddp_relative_residuals(
    model: DdpStepModel,
    accumulation_steps: Sequence[int],
    window_seconds: Sequence[float],
    every_seconds: Sequence[float],
) -> dict[tuple[int, str], float]:
    """Return ``(modelled - measured) / measured`` for each (k, sync) measured."""
    if not isinstance(model, DdpStepModel):
        raise TypeError(f"model must be a DdpStepModel (e.g. from fit_ddp_step_model); got "
                        f"{type(model).__name__}")
    return {(k, sync): model.step_seconds(k, sync) / seconds - 1.0
            for k, sync, seconds in _ddp_times(accumulation_steps, window_seconds,
                                               every_seconds)}


@dataclass(frozen=True)
class AccumulationPlan:
    """One choice of micro-batch size and accumulation steps: its memory and time."""

    micro_batch_size: int
    accumulation_steps: int
    memory: MemoryBreakdown
    window_seconds: float

    @property
    def effective_batch_size(self) -> int:
        """Return the samples per optimizer step: micro-batch size x accumulation steps."""
        return self.micro_batch_size * self.accumulation_steps

    @property
    def seconds_per_sample(self) -> float:
        """Return the modelled seconds per training sample."""
        return self.window_seconds / self.effective_batch_size


def plan_accumulation(
    *,
    num_parameters: int,
    activation_bytes_per_sample: float,
    step_time: StepTimeModel,
    micro_batch_size: int,
    accumulation_steps: int,
    optimizer: Optimizer = "adamw",
    precision: Precision = "fp32",
) -> AccumulationPlan:
    """Return the memory budget and the modelled window time of one (micro-batch, k) choice."""
    if not isinstance(step_time, StepTimeModel):
        raise TypeError(f"step_time must be a StepTimeModel (e.g. from fit_step_time); got "
                        f"{type(step_time).__name__}")
    memory = memory_budget(
        num_parameters,
        optimizer=optimizer,
        precision=precision,
        activation_bytes_per_sample=activation_bytes_per_sample,
        micro_batch_size=micro_batch_size,
    )
    seconds = step_time.window_seconds(micro_batch_size, accumulation_steps)
    return AccumulationPlan(micro_batch_size, accumulation_steps, memory, seconds)


def max_micro_batch_size(
    device_bytes: float,
    num_parameters: int,
    activation_bytes_per_sample: float,
    *,
    optimizer: Optimizer = "adamw",
    precision: Precision = "fp32",
    reserved_bytes: float = 0.0,
    activation_bytes_fixed: float = 0.0,
    ddp_bucket_copy: bool = False,
) -> int:
    """Return the largest micro-batch whose :func:`memory_budget` fits in ``device_bytes``
    minus ``reserved_bytes`` (runtime context, workspace, fragmentation); 0 if even the
    parameters, gradients, optimizer state, fixed activations (and, with
    ``ddp_bucket_copy=True``, DDP's default copy of the gradients) do not fit.
    """
    check_number("activation_bytes_per_sample", activation_bytes_per_sample, low=0,
                 low_open=True)
    check_number("device_bytes", device_bytes, low=0, low_open=True)
    check_number("reserved_bytes", reserved_bytes, low=0)
    static = memory_budget(num_parameters, optimizer=optimizer, precision=precision,
                           activation_bytes_fixed=activation_bytes_fixed,
                           ddp_bucket_copy=ddp_bucket_copy).total
    free = device_bytes - reserved_bytes - static
    return max(0, int(free // activation_bytes_per_sample))


def accumulation_steps_for(effective_batch_size: int, micro_batch_size: int,
                           world_size: int = 1) -> int:
    """Return the smallest k with micro_batch_size * k * world_size >= effective_batch_size."""
    for label, value in (("effective_batch_size", effective_batch_size),
                         ("micro_batch_size", micro_batch_size), ("world_size", world_size)):
        check_positive_int(label, value)
    return -(-effective_batch_size // (micro_batch_size * world_size))


# ---- at cluster scale: a transformer family's measured activations, data-parallel devices


@dataclass(frozen=True)
class _TransformerActivations:
    """Activation bytes of a transformer encoder as a function of the sequence length s and
    the layer count L. Per sample: ``s * outside_per_token + L * (s * per_layer_per_token +
    s**2 * per_layer_per_token_squared)`` (the s**2 term is attention scores). Fixed, whatever
    the batch: ``outside_fixed + L * per_layer_fixed`` (e.g. autocast's 16-bit weight copies).
    """

    outside_fixed: float
    outside_per_token: float
    per_layer_fixed: float
    per_layer_per_token: float
    per_layer_per_token_squared: float

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:  # fitted coefficients: any sign, but finite
            check_number(f"_TransformerActivations.{name}", getattr(self, name))

    def bytes_per_sample(self, sequence_length: int, num_layers: int) -> float:
        """Return the modelled activation bytes that grow with each sample."""
        check_positive_int("sequence_length", sequence_length)
        check_positive_int("num_layers", num_layers)
        s = float(sequence_length)
        per_layer = s * self.per_layer_per_token + s * s * self.per_layer_per_token_squared
        return s * self.outside_per_token + num_layers * per_layer

    def fixed_bytes(self, num_layers: int) -> float:
        """Return the modelled activation bytes that do not depend on the batch."""
        check_positive_int("num_layers", num_layers)
        return self.outside_fixed + num_layers * self.per_layer_fixed

    def bytes_for(self, micro_batch_size: int, sequence_length: int, num_layers: int) -> float:
        """Return the modelled activation bytes of a micro-batch."""
        check_positive_int("micro_batch_size", micro_batch_size)
        return (self.fixed_bytes(num_layers)
                + micro_batch_size * self.bytes_per_sample(sequence_length, num_layers))


def fit_transformer_activations(
    measure: Callable[[int, int], int], lengths: tuple[int, int, int] = (32, 64, 128)
) -> _TransformerActivations:
    """Return :class:`_TransformerActivations` fitted to ``measure(num_layers, length)`` (the
    measured activation bytes of ONE sample) at 1 and 2 layers and three lengths: the
    difference between 2 and 1 layers is one layer, solved exactly for its constant, s and
    s**2 terms; the rest (embeddings, head) is fitted as constant + s.
    """
    if not callable(measure):
        raise TypeError("measure must be callable as measure(num_layers, length) -> bytes; got "
                        f"{type(measure).__name__}")
    _check_lengths(lengths)
    measured = {(layers, s): Fraction(_measured_bytes(measure, layers, s)) for layers in (1, 2)
                for s in lengths}
    # exact rational arithmetic: the byte counts are integers, so the fit is exact and does
    # not depend on the CPU's vector path or the math library (a float solve once printed
    # 1.13 GiB on one CPU and 1.12 GiB on another)
    layer = [measured[2, s] - measured[1, s] for s in lengths]
    fixed, per_token, per_token_squared = _solve_quadratic_through(lengths, layer)
    outside = [measured[1, s] - extra for s, extra in zip(lengths, layer, strict=True)]
    outside_fixed, outside_per_token = _least_squares_line(lengths, outside)
    return _TransformerActivations(float(outside_fixed), float(outside_per_token), float(fixed),
                                  float(per_token), float(per_token_squared))


def _check_lengths(lengths: object) -> None:
    if (not isinstance(lengths, (tuple, list)) or len(lengths) != 3
            or not all(is_int(length) for length in lengths)
            or not 0 < lengths[0] < lengths[1] < lengths[2]):
        raise ValueError(f"lengths must be three increasing positive ints; got {lengths!r}")


def _measured_bytes(measure: Callable[[int, int], int], num_layers: int, length: int) -> int:
    value = measure(num_layers, length)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return check_int(f"measure({num_layers}, {length}) (bytes)", value, low=0)


def _solve_quadratic_through(xs: Sequence[int], ys: Sequence[Fraction]) -> tuple[Fraction, ...]:
    """(c0, c1, c2) with c0 + c1 x + c2 x**2 = y at the three points, exactly (Lagrange)."""
    (x0, x1, x2), (y0, y1, y2) = (Fraction(x) for x in xs), ys
    first_01 = (y1 - y0) / (x1 - x0)
    first_12 = (y2 - y1) / (x2 - x1)
    c2 = (first_12 - first_01) / (x2 - x0)
    c1 = first_01 - c2 * (x0 + x1)
    return y0 - c1 * x0 - c2 * x0 * x0, c1, c2


def _least_squares_line(xs: Sequence[int], ys: Sequence[Fraction]) -> tuple[Fraction, Fraction]:
    """(intercept, slope) of the least-squares line through the points, exactly."""
    count = len(xs)
    mean_x = Fraction(sum(xs), count)
    mean_y = sum(ys, Fraction(0)) / count
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    return mean_y - slope * mean_x, slope


@dataclass(frozen=True)
class TransformerShape:
    """A transformer encoder family at fixed width: parameters outside the layers and per
    layer, and its measured activation model."""

    params_outside: int
    params_per_layer: int
    activations: _TransformerActivations

    def __post_init__(self) -> None:
        check_int("params_outside", self.params_outside, low=0)
        check_int("params_per_layer", self.params_per_layer, low=1)
        if not isinstance(self.activations, _TransformerActivations):
            raise TypeError("activations must be a _TransformerActivations; got "
                            f"{type(self.activations).__name__}")

    def num_parameters(self, num_layers: int) -> int:
        """Return the parameter count at ``num_layers`` layers."""
        check_positive_int("num_layers", num_layers)
        return self.params_outside + num_layers * self.params_per_layer


@dataclass(frozen=True)
class ClusterPlan:
    """Per-device memory and the effective batch of a data-parallel accumulation setup."""

    memory: MemoryBreakdown
    device_bytes: float
    reserved_bytes: float
    effective_batch_size: int

    @property
    def fits(self) -> bool:
        """Return True when the step fits in one device (after the reserve)."""
        return self.memory.total + self.reserved_bytes <= self.device_bytes


def plan_cluster(
    shape: TransformerShape,
    *,
    num_layers: int,
    sequence_length: int,
    micro_batch_size: int,
    accumulation_steps: int,
    world_size: int,
    device_bytes: float,
    reserved_bytes: float = 0.0,
    precision: Precision = "fp32",
    optimizer: Optimizer = "adamw",
) -> ClusterPlan:
    """Return the per-device memory budget (every device holds a full replica: plain data
    parallelism) and the effective batch micro x k x devices. ``shape``'s activations must
    have been measured in the precision planned for.
    """
    if not isinstance(shape, TransformerShape):
        raise TypeError(f"shape must be a TransformerShape (e.g. from measure_bert_shape); got "
                        f"{type(shape).__name__}")
    for label, value in (("num_layers", num_layers), ("sequence_length", sequence_length),
                         ("accumulation_steps", accumulation_steps), ("world_size", world_size)):
        check_positive_int(label, value)
    check_number("device_bytes", device_bytes, low=0, low_open=True)
    check_number("reserved_bytes", reserved_bytes, low=0)
    memory = memory_budget(
        shape.num_parameters(num_layers), optimizer=optimizer, precision=precision,
        micro_batch_size=micro_batch_size,
        activation_bytes_per_sample=shape.activations.bytes_per_sample(sequence_length,
                                                                       num_layers),
        activation_bytes_fixed=shape.activations.fixed_bytes(num_layers),
    )
    return ClusterPlan(memory, device_bytes, reserved_bytes,
                       micro_batch_size * accumulation_steps * world_size)


def measure_bert_shape(
    config: dict[str, int],
    *,
    num_labels: int = 2,
    lengths: tuple[int, int, int] = (32, 64, 128),
    autocast_dtype: torch.dtype | None = None,
    model_dtype: torch.dtype = torch.float32,
) -> TransformerShape:
    """Return a :class:`TransformerShape` for a BERT family: parameter counts per layer and
    outside the layers (meta device), and an activation model fitted to activation bytes
    MEASURED on this machine for one sample at 1 and 2 layers and three lengths, with
    ``autocast_dtype`` (torch.autocast) or the model cast to ``model_dtype``.
    """
    from transformers import BertConfig, BertForSequenceClassification

    from gradaccum_lib.losses import bert_classification_loss
    from gradaccum_lib.workloads.models import count_bert_parameters

    if not isinstance(config, dict) or not is_int(config.get("vocab_size")):
        raise TypeError("config must be a dict of BertConfig fields with an int 'vocab_size' "
                        f"(e.g. ROBERTA_WWM_EXT_LARGE); got {type(config).__name__}")
    _check_lengths(lengths)
    if autocast_dtype not in (None, torch.float16, torch.bfloat16):
        raise ValueError("autocast_dtype must be None, torch.float16 or torch.bfloat16; got "
                         f"{autocast_dtype!r}")
    if not isinstance(model_dtype, torch.dtype) or not model_dtype.is_floating_point:
        raise TypeError(f"model_dtype must be a floating-point torch.dtype; got {model_dtype!r}")
    one = count_bert_parameters({**config, "num_hidden_layers": 1}, num_labels)
    two = count_bert_parameters({**config, "num_hidden_layers": 2}, num_labels)

    built: dict[int, nn.Module] = {}

    def measure(num_layers: int, length: int) -> int:
        if num_layers not in built:  # weights do not matter for the bytes; build each once
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                bert_config = BertConfig(**{**config, "num_hidden_layers": num_layers},
                                         num_labels=num_labels)
                built[num_layers] = BertForSequenceClassification(bert_config).to(model_dtype)
        generator = torch.Generator().manual_seed(0)
        sample = {
            "input_ids": torch.randint(5, config["vocab_size"], (1, length), generator=generator),
            "attention_mask": torch.ones(1, length, dtype=torch.long),
            "labels": torch.zeros(1, dtype=torch.long),
        }
        return activation_bytes(built[num_layers], bert_classification_loss, sample,
                                autocast_dtype=autocast_dtype)

    return TransformerShape(one - (two - one), two - one,
                            fit_transformer_activations(measure, lengths))
