"""The denominator lab (notebook 03): which number a token loss is divided by, and what each
choice does to the update.

A window is described by the real-token counts of its sequences: on each rank, ``k`` or fewer
micro-batches, each holding one or more sequences. :func:`measure_window` builds that window as
padded token batches for a small token model, computes the large batch's gradient with the
library's ground truth, and, from each sequence's own summed-loss gradient, the gradient each
normalisation produces once DDP has averaged the ranks. The errors are computed from those
gradients, not drawn from a formula. The widget around it is
:func:`gradaccum_course.widgets.denominator_lab`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from gradaccum_lib import full_batch_gradients
from gradaccum_lib.gradients import flatten_gradients
from gradaccum_lib.losses import token_classification_loss
from gradaccum_lib.workloads.data import IGNORE_INDEX
from gradaccum_lib.workloads.models import TokenTagger

__all__ = ["NORMALISATIONS", "PRESETS", "WindowMeasurement", "format_layout", "measure_window",
           "parse_layout", "percent", "plot_window", "preset_layout"]

#: the window's layout: per rank, its micro-batches; per micro-batch, its sequences' real tokens
Layout = list[list[list[int]]]

#: the normalisations compared, in the order they are shown; the last is the right one
NORMALISATIONS = ("mean of micro-batch means", "sum / k", "rank-local token count",
                  "per sample", "window's global token count")
#: the layouts a reader can start from
PRESETS = ("uneven tokens", "equal tokens", "a rank with zero tokens", "short last window")

_VOCAB, _TAGS, _WIDTH = 40, 5, 8
_SEQUENCES_PER_MICRO_BATCH = 2
_MAX_TOKENS = 64  # per sequence: the lab's model is small, not its inputs' limit


@dataclass(frozen=True)
class WindowMeasurement:
    """What one window's normalisations give. ``weights[name]``: the weight each sequence's
    tokens get relative to the right one (1.0 = right; NaN where the normalisation divides 0 by
    0: a sequence without a real token, which contributes nothing), in the layout's order;
    ``errors[name]``: the update's relative error against the large batch's gradient;
    ``logged``: what three loss readouts report (NaN: a mean over no token)."""

    layout: tuple[tuple[tuple[int, ...], ...], ...]
    accumulation_steps: int
    weights: dict[str, tuple[float, ...]]
    errors: dict[str, float]
    logged: dict[str, float]


def preset_layout(preset: str, ranks: int, accumulation_steps: int, *, seed: int = 0) -> Layout:
    """Return the layout of ``preset`` (one of :data:`PRESETS`) for ``ranks`` ranks and ``k``."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {PRESETS}; got {preset!r}")
    _check_counts(ranks, accumulation_steps)
    generator = random.Random(seed)
    held = (accumulation_steps + 1) // 2 if preset == "short last window" else accumulation_steps
    layout = []
    for rank in range(ranks):
        micro_batches = []
        for _ in range(held):
            if preset == "equal tokens":
                micro_batches.append([8] * _SEQUENCES_PER_MICRO_BATCH)
            elif preset == "a rank with zero tokens" and rank == ranks - 1:
                micro_batches.append([0] * _SEQUENCES_PER_MICRO_BATCH)
            else:
                micro_batches.append([generator.choice((1, 2, 3, 5, 8, 13, 21))
                                      for _ in range(_SEQUENCES_PER_MICRO_BATCH)])
        layout.append(micro_batches)
    return layout


def format_layout(layout: Layout) -> str:
    """Return ``layout`` as the lab's text: a line per rank, micro-batches separated by spaces,
    the sequences of one micro-batch joined by ``+`` (``"3+5 8+1"``)."""
    return "\n".join(" ".join("+".join(str(n) for n in micro) for micro in rank)
                     for rank in layout)


def parse_layout(text: str, accumulation_steps: int) -> Layout:
    """Return the layout that ``text`` (as :func:`format_layout` writes it) describes, or raise
    a ValueError naming the rank and micro-batch at fault."""
    _check_counts(1, accumulation_steps)
    lines = [line.split() for line in text.strip().splitlines() if line.strip()]
    if not 1 <= len(lines) <= 4:
        raise ValueError(f"write one line per rank, 1 to 4 lines; got {len(lines)}")
    layout = []
    for rank, fields in enumerate(lines):
        if len(fields) > accumulation_steps:
            raise ValueError(f"rank {rank} holds {len(fields)} micro-batches; a window holds at "
                             f"most k = {accumulation_steps}")
        micro_batches = []
        for index, field in enumerate(fields):
            try:
                counts = [int(part) for part in field.split("+")]
            except ValueError:
                raise ValueError(f"rank {rank}, micro-batch {index}: {field!r} is not token "
                                 "counts joined by '+' (e.g. 3+5)") from None
            if any(not 0 <= n <= _MAX_TOKENS for n in counts):
                raise ValueError(f"rank {rank}, micro-batch {index}: token counts must be in "
                                 f"0..{_MAX_TOKENS}; got {field!r}")
            micro_batches.append(counts)
        layout.append(micro_batches)
    return layout


def measure_window(layout: Layout, accumulation_steps: int, *, seed: int = 0
                   ) -> WindowMeasurement:
    """Measure every normalisation of :data:`NORMALISATIONS` on the window ``layout`` (ranks
    whose micro-batches hold sequences of the given real-token counts) with ``k`` configured.

    Each rank's loop divides as its normalisation says, DDP then averages the ranks' gradients;
    the large batch's gradient (the window's mean over its real tokens) comes from
    :func:`~gradaccum_lib.full_batch_gradients` on all the window's sequences at once. Raises a
    ValueError for a window without a real token (it has no large batch to compare with)."""
    _check_counts(len(layout), accumulation_steps)
    sequences = [(rank, index, n) for rank, micro_batches in enumerate(layout)
                 for index, micro in enumerate(micro_batches) for n in micro]
    total = sum(n for _, _, n in sequences)
    if total == 0:
        raise ValueError("the window holds no real token: there is no mean to compare with")
    model = TokenTagger(_VOCAB, _WIDTH, _TAGS, seed=seed)
    window = _concatenated([_sequence_batch(n, seed=1000 * seed + position)
                            for position, (_, _, n) in enumerate(sequences)])
    truth = flatten_gradients(full_batch_gradients(model, token_classification_loss, window))
    # each sequence's summed token loss: the one quantity every normalisation divides
    token_losses = torch.nn.functional.cross_entropy(
        model(window["input_ids"]).transpose(1, 2), window["labels"],
        ignore_index=IGNORE_INDEX, reduction="none")
    summed = token_losses.sum(dim=1)
    weights = {name: tuple(_weight(name, layout, accumulation_steps, rank, index, n, total)
                           for rank, index, n in sequences) for name in NORMALISATIONS}
    errors = {}
    for name in NORMALISATIONS:
        # the update the ranks' loops produce together (DDP sums their gradients): the
        # gradient of their weighted sums. A mean over no token is 0 / 0, a NaN loss, but
        # cross-entropy sends no gradient from an ignored token: its NaN weight adds nothing.
        scale = torch.tensor(weights[name], dtype=summed.dtype) / total
        model.zero_grad(set_to_none=True)
        (scale * summed).sum().backward(retain_graph=True)
        update = flatten_gradients({name: p.grad for name, p in model.named_parameters()})
        errors[name] = float((update - truth).norm() / truth.norm())
    losses = summed.detach().tolist()
    return WindowMeasurement(
        layout=tuple(tuple(tuple(micro) for micro in rank) for rank in layout),
        accumulation_steps=accumulation_steps, weights=weights, errors=errors,
        logged=_logged(layout, sequences, losses, total))


def percent(error: float) -> str:
    """``error`` (a relative error) as the lab prints it: ``63.6%``, ``1,612%``."""
    return f"{100 * error:.3g}%" if error < 10 else f"{100 * error:,.0f}%"


def _check_counts(ranks: int, accumulation_steps: int) -> None:
    if not (isinstance(ranks, int) and 1 <= ranks <= 4):
        raise ValueError(f"ranks must be 1 to 4; got {ranks!r}")
    if not (isinstance(accumulation_steps, int) and 1 <= accumulation_steps <= 8):
        raise ValueError(f"k must be 1 to 8; got {accumulation_steps!r}")


def _sequence_batch(tokens: int, *, seed: int) -> dict[str, torch.Tensor]:
    """One sequence of ``tokens`` real tokens, padded to the lab's longest (token ids and tags
    drawn from ``seed``)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, _VOCAB, (1, _MAX_TOKENS), generator=generator)
    labels = torch.randint(0, _TAGS, (1, _MAX_TOKENS), generator=generator)
    ids[:, tokens:], labels[:, tokens:] = 0, IGNORE_INDEX
    return {"input_ids": ids, "labels": labels}


def _concatenated(batches: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.cat([batch[key] for batch in batches]) for key in batches[0]}


def _weight(name: str, layout: Layout, k: int, rank: int, index: int, n: int,
            total: int) -> float:
    """The weight of one token of a sequence (``n`` real tokens, in ``rank``'s micro-batch
    ``index``) under ``name``, relative to the right weight 1 / (the window's tokens); DDP
    averages the ranks, hence the 1 / ranks."""
    ranks = len(layout)
    micro = layout[rank][index]
    if name == "mean of micro-batch means":  # each micro-batch's mean token loss, divided by k
        tokens = sum(micro)
        return math.nan if tokens == 0 else total / (ranks * k * tokens)
    if name == "sum / k":  # the summed token loss, divided by the configured k
        return total / (ranks * k)
    if name == "rank-local token count":  # each rank divides by its own window's tokens
        tokens = sum(sum(m) for m in layout[rank])
        return math.nan if tokens == 0 else total / (ranks * tokens)
    if name == "per sample":  # each sequence's mean, averaged over the window's sequences
        samples = sum(len(m) for r in layout for m in r)
        return 0.0 if n == 0 else total / (samples * n)
    return 1.0  # the window's global token count: the large batch's mean


def _logged(layout: Layout, sequences: list[tuple[int, int, int]], losses: list[float],
            total: int) -> dict[str, float]:
    """What three loss readouts report for the window: rank 0's last micro-batch's mean, the
    mean of every micro-batch's mean, and the window's token-weighted mean (the true one)."""
    sums: dict[tuple[int, int], list[float]] = {}
    for (rank, index, n), loss in zip(sequences, losses, strict=True):
        entry = sums.setdefault((rank, index), [0.0, 0])
        entry[0] += loss
        entry[1] += n
    means = {key: (s / n if n else math.nan) for key, (s, n) in sums.items()}
    last = (0, len(layout[0]) - 1)
    return {"rank 0's last micro-batch": means.get(last, math.nan),
            "mean of micro-batch means": sum(means.values()) / len(means),
            "token-weighted window mean": sum(losses) / total}


def plot_window(measurement: WindowMeasurement):  # noqa: ANN201 - a matplotlib Figure
    """Return the lab's figure, without words (the widget's table names the rows in the
    reader's language): left, the weight each sequence's tokens get under normalisation 1-5,
    over the right weight (log2: 0 is right; grey: no real token); right, each update's error."""
    import matplotlib
    import matplotlib.colors as colors
    from matplotlib.figure import Figure

    rows = range(1, len(NORMALISATIONS) + 1)
    tokens = [(rank, index, n) for rank, micro_batches in enumerate(measurement.layout)
              for index, micro in enumerate(micro_batches) for n in micro]
    columns = [f"r{rank} m{index}: {n}" for rank, index, n in tokens]
    figure = Figure(figsize=(9, 2.8), layout="constrained")
    heat, bars = figure.subplots(1, 2, width_ratios=(3, 1.2), sharey=True)
    # a sequence without a real token has no weight to show: grey (NaN), whatever its divisor
    image = heat.imshow([[math.log2(w) if n else math.nan
                          for w, (_, _, n) in zip(measurement.weights[name], tokens, strict=True)]
                         for name in NORMALISATIONS],
                        aspect="auto", norm=colors.TwoSlopeNorm(0.0, -4.0, 4.0),
                        cmap=matplotlib.colormaps["RdBu_r"].with_extremes(bad="0.75"),
                        extent=(-0.5, len(columns) - 0.5, len(rows) + 0.5, 0.5))
    heat.set_yticks(list(rows), [str(row) for row in rows])
    step = max(1, len(columns) // 16)
    heat.set_xticks(range(0, len(columns), step), columns[::step], fontsize=7, rotation=90)
    figure.colorbar(image, ax=heat, shrink=0.9, label="log2")
    errors = [measurement.errors[name] for name in NORMALISATIONS]
    bars.barh(list(rows), [max(e, 1e-4) for e in errors],
              color=["tab:green" if e < 1e-9 else "tab:red" for e in errors])
    bars.set_xscale("log")
    bars.set_xlim(1e-4, 100)
    for row, error in zip(rows, errors, strict=True):
        bars.text(1.5e-4, row, "< 1e-9" if error < 1e-9 else percent(error), va="center",
                  fontsize=8)
    return figure
