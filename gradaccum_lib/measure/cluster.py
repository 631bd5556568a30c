"""Planning at cluster scale: a transformer family's parameters and MEASURED activations,
scaled to data-parallel devices.

- :class:`TransformerActivations` / :func:`fit_transformer_activations`: activation bytes as a
  function of sequence length and layer count, fitted exactly to measurements;
- :func:`measure_bert_shape`: a BERT family's parameter counts and activation model;
- :func:`plan_cluster`: per-device memory and the effective batch of micro x k x devices.

(Re-exported by :mod:`gradaccum_lib.measure.planning`, the time x memory models of one device.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import torch
from torch import nn

from ..runtime import check_int, check_number, check_positive_int, is_int
from .memory import MemoryBreakdown, Optimizer, Precision, activation_bytes, memory_budget

__all__ = [
    "ClusterPlan",
    "fit_transformer_activations",
    "measure_bert_shape",
    "plan_cluster",
    "TransformerActivations",
    "TransformerShape",
]


@dataclass(frozen=True)
class TransformerActivations:
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
            check_number(f"TransformerActivations.{name}", getattr(self, name))

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
) -> TransformerActivations:
    """Return :class:`TransformerActivations` fitted to ``measure(num_layers, length)`` (the
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
    return TransformerActivations(float(outside_fixed), float(outside_per_token), float(fixed),
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
    activations: TransformerActivations

    def __post_init__(self) -> None:
        check_int("params_outside", self.params_outside, low=0)
        check_int("params_per_layer", self.params_per_layer, low=1)
        if not isinstance(self.activations, TransformerActivations):
            raise TypeError("activations must be a TransformerActivations; got "
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

    from ..losses import bert_classification_loss
    from ..workloads.models import count_bert_parameters

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
