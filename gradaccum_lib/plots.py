"""Figures for the notebooks. Every helper returns the Figure and never writes a file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure

__all__ = ["plot_errors"]


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
) -> Figure:
    """Return a log-scale line plot of each named error series against ``x``.

    Values below ``floor`` (exact zeros included) are drawn at ``floor``, since a log axis has
    no zero; ``bound``, if given, is drawn as a dashed horizontal line (an asserted limit), and
    each ``reference`` series (a guide such as 1/sqrt(R)) as a dashed line without markers.
    """
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
    axes.set_yscale("log")
    if log_x:
        axes.set_xscale("log")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if title:
        axes.set_title(title)
    axes.grid(True, which="major", alpha=0.3)
    axes.legend()
    return figure
