"""Figures for the notebooks. Every helper returns the Figure and never writes a file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure

from gradaccum_lib.measure.memory import MemoryBreakdown
from gradaccum_lib.measure.planning import AccumulationPlan, ClusterPlan, DdpStepModel

__all__ = [
    "MIB",
    "plot_accumulation_plan",
    "plot_cluster_plan",
    "plot_curves",
    "plot_ddp_step",
    "plot_errors",
    "plot_memory_breakdown",
]

MIB = 2**20  # the figures' unit of memory
_PARTS = ("parameters", "gradients", "optimizer_state", "master_weights", "ddp_buckets",
          "activations")


def plot_errors(
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    *,
    xlabel: str,
    ylabel: str = "relative difference to the full batch",
    title: str = "",
    bound: float | None = None,
    reference: Mapping[str, Sequence[float]] | None = None,
    floor: float = 1e-18,
    log_x: bool = False,
    log_y: bool = True,
) -> Figure:
    """Return a line plot, log-scale unless ``log_y=False`` (growth that is linear is read on a
    linear axis), of each named error series against ``x``.

    On a log axis values below ``floor`` (exact zeros included) are drawn at ``floor``, since a
    log axis has no zero, and marked so (hollow triangles, one legend entry saying so);
    ``bound``, if given, is drawn as a dashed horizontal line (an asserted limit), and each
    ``reference`` series (a guide such as 1/sqrt(R)) as a dashed line without markers.
    """
    floor = floor if log_y else float("-inf")
    if not series:
        raise ValueError("series must name at least one error series")
    reference = dict(reference or {})
    for name, values in {**series, **reference}.items():
        if len(values) != len(x):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(x)} x values")
    figure = Figure(figsize=(6.4, 3.6), layout="constrained")
    axes = figure.subplots()
    for name, values in series.items():
        axes.plot(x, [max(float(v), floor) for v in values], marker="o", label=name)
    for name, values in reference.items():
        axes.plot(x, [max(float(v), floor) for v in values], linestyle="--", color="grey",
                  label=name)
    if bound is not None:
        axes.axhline(bound, color="grey", linestyle="--", linewidth=1, label=f"bound {bound:g}")
    floored = [(xi, floor) for values in series.values()
               for xi, v in zip(x, values, strict=True) if float(v) < floor]
    if floored:
        axes.plot(*zip(*floored, strict=True), linestyle="none", marker="v", markersize=9,
                  markerfacecolor="none", color="black",
                  label=f"exact 0 (or below {floor:g}), drawn at {floor:g}")
    axes.set_yscale("log" if log_y else "linear")
    if log_x:
        axes.set_xscale("log")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if title:
        axes.set_title(title)
    axes.grid(True, which="major", alpha=0.3)
    axes.legend()
    return figure


def _stacked_memory_bars(axes, breakdowns: Mapping[str, MemoryBreakdown], *,
                         legend: bool = True) -> None:
    labels = list(breakdowns)
    bottoms = [0.0] * len(labels)
    for part in _PARTS:
        heights = [getattr(breakdowns[label], part) / MIB for label in labels]
        if not any(heights):
            continue
        axes.bar(labels, heights, bottom=bottoms, label=part.replace("_", " "))
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    axes.set_ylabel("MiB")
    if legend:
        axes.legend(fontsize="small")


def plot_memory_breakdown(
    breakdowns: Mapping[str, MemoryBreakdown], *, title: str = "", xlabel: str = ""
) -> Figure:
    """Return stacked bars (MiB) of each named breakdown's parts."""
    if not breakdowns:
        raise ValueError("breakdowns must name at least one MemoryBreakdown")
    figure = Figure(figsize=(6.4, 3.6), layout="constrained")
    axes = figure.subplots()
    _stacked_memory_bars(axes, breakdowns)
    axes.set_xlabel(xlabel)
    if title:
        axes.set_title(title)
    return figure


def plot_accumulation_plan(plan: AccumulationPlan, without: AccumulationPlan) -> Figure:
    """Return memory and time side by side: ``plan`` vs the same effective batch in one pass
    (``without`` accumulation). The memory legend sits below both panels, outside the axes, so
    it covers no bar whatever the slider's values.
    """
    figure = Figure(figsize=(8.0, 3.4), layout="constrained")
    memory_axes, time_axes = figure.subplots(1, 2)
    labels = {
        f"k={plan.accumulation_steps} x {plan.micro_batch_size}": plan,
        f"k=1 x {without.micro_batch_size}": without,
    }
    _stacked_memory_bars(memory_axes, {label: p.memory for label, p in labels.items()},
                         legend=False)
    handles, names = memory_axes.get_legend_handles_labels()
    figure.legend(handles, names, loc="outside lower center", ncols=len(names), fontsize="small")
    memory_axes.set_title(f"memory per step (effective batch {plan.effective_batch_size})")
    time_axes.bar(list(labels), [1e3 * p.window_seconds for p in labels.values()],
                  color=["tab:blue", "tab:grey"])
    time_axes.set_ylabel("ms per optimizer step (model)")
    time_axes.set_title("time per optimizer step")
    return figure


def plot_curves(
    curves: Mapping[str, Sequence[float]],
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    x_start: int = 1,
) -> Figure:
    """Return a line plot of named curves against their index, counted from ``x_start`` (e.g.
    loss per window); later curves are dashed so that coinciding curves stay visible.
    """
    if not curves:
        raise ValueError("curves must name at least one curve")
    figure = Figure(figsize=(6.4, 3.6), layout="constrained")
    axes = figure.subplots()
    styles = ["-", "--", ":", "-."]
    for index, (name, values) in enumerate(curves.items()):
        axes.plot(range(x_start, x_start + len(values)), values,
                  linestyle=styles[index % len(styles)], linewidth=2.5 if index == 0 else 1.5,
                  label=name)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if title:
        axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    return figure


def plot_cluster_plan(plan: ClusterPlan) -> Figure:
    """Return one stacked bar of a device's memory (GiB) against its capacity."""
    figure = Figure(figsize=(4.8, 3.6), layout="constrained")
    axes = figure.subplots()
    bottom = 0.0
    for part in (*_PARTS, "reserved"):
        value = plan.reserved_bytes if part == "reserved" else getattr(plan.memory, part)
        if value:
            axes.bar(["one device"], [value / 2**30], bottom=[bottom], label=part.replace("_", " "))
            bottom += value / 2**30
    axes.axhline(plan.device_bytes / 2**30, color="black", linestyle="--",
                 label=f"capacity {plan.device_bytes / 2**30:.0f} GiB")
    axes.set_ylabel("GiB")
    axes.set_title(f"effective batch {plan.effective_batch_size}: "
                   + ("fits" if plan.fits else "does not fit"))
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return figure


def plot_ddp_step(model: DdpStepModel, accumulation_steps: int) -> Figure:
    """Return stacked bars (ms) of compute and communication per optimizer step, syncing every
    micro-step vs once per window; one panel of :func:`plot_accumulation_plan`'s size (the
    sliders of notebooks 05 and 02 show them)."""
    figure = Figure(figsize=(4.0, 3.4), layout="constrained")
    axes = figure.subplots()
    labels = ["sync every micro-step", "sync once per window"]
    syncs = [accumulation_steps, 1]
    compute = [1e3 * (accumulation_steps * model.compute_per_micro_step + model.per_step)] * 2
    comm = [1e3 * s * model.comm_per_sync for s in syncs]
    axes.bar(labels, compute, label="compute")
    axes.bar(labels, comm, bottom=compute, label="communication")
    axes.set_ylabel("ms per optimizer step")
    axes.set_title(f"k = {accumulation_steps}")
    axes.legend()
    return figure
