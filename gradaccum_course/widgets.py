"""ipywidgets controls bound to pure library functions.

Each control calls a pure function of the library and redraws from its result, so whatever a
slider shows is what the tested function returns. Without a front end, the notebook shows the
default (the function is called once when the control is built).
"""

from __future__ import annotations

import io

import ipywidgets as widgets
from matplotlib.figure import Figure

from gradaccum_lib.measure.memory import Optimizer, Precision
from gradaccum_lib.measure.planning import (
    AccumulationPlan,
    ClusterPlan,
    DdpStepModel,
    StepTimeModel,
    TransformerShape,
    plan_accumulation,
    plan_cluster,
)
from gradaccum_lib.runtime import check_int, check_number, check_positive_int

from .plots import MIB, plot_accumulation_plan, plot_cluster_plan, plot_ddp_step

__all__ = [
    "accumulation_explorer",
    "ddp_time_explorer",
    "cluster_explorer",
    "learning_rate_explorer",
]


# a slider's track spans most of the notebook's width (ipywidgets' default is ~60 px of track
# for a long description), so a 1-256 range can be set with a mouse
_SLIDER_WIDTH = "95%"
_SLIDER_MAX_WIDTH = "760px"
_SLIDER_STYLE = {"description_width": "initial"}


def _slider_layout() -> widgets.Layout:
    return widgets.Layout(width=_SLIDER_WIDTH, max_width=_SLIDER_MAX_WIDTH)


def _int_slider(value: int, low: int, high: int, description: str) -> widgets.IntSlider:
    return widgets.IntSlider(value=value, min=low, max=high, description=description,
                             continuous_update=False, style=_SLIDER_STYLE,
                             layout=_slider_layout())


def _check_kind(label: str, value: object, kind: type, hint: str) -> None:
    if not isinstance(value, kind):
        raise TypeError(f"{label} must be a {kind.__name__} ({hint}); got {type(value).__name__}")


def _check_slider(label: str, value: object, high: object, high_label: str) -> None:
    """A slider's start value: an int in [1, high] (a slider would silently clamp it)."""
    check_positive_int(high_label, high)
    check_int(label, value, low=1, high=high)


# A redrawn figure is shown at its own size, _CSS_DPI CSS pixels to the inch (a browser's 96: a
# 10-point label shows at 13 CSS pixels, like the notebook's text), from a PNG of _PIXEL_RATIO
# image pixels per CSS pixel, so that a high-density screen (devicePixelRatio 2) shows it as
# sharp as text. Without a width, an Image in a VBox is stretched to the output's width (a flex
# column stretches its children): notebook 05's 360 x 306 PNG was shown at 964 x 819, blurred.
_CSS_DPI = 96
_PIXEL_RATIO = 2


def _figure_png(figure: Figure, *, dpi: float = _PIXEL_RATIO * _CSS_DPI) -> bytes:
    """Return ``figure`` rendered as PNG bytes at ``dpi`` (in memory; no file is written)."""
    _check_kind("figure", figure, Figure, "e.g. from gradaccum_course.plots")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def _figure_area() -> widgets.Image:
    """An Image that :func:`_show_figure` fills; never wider than the output area (the
    widgets' CSS keeps ``max-width: 100%; height: auto``, so it shrinks in proportion)."""
    return widgets.Image(format="png", layout=widgets.Layout(max_width="100%"))


def _show_figure(area: widgets.Image, figure: Figure) -> None:
    """Show ``figure`` in ``area`` at its size in CSS pixels (figure inches x _CSS_DPI), from a
    PNG with _PIXEL_RATIO times as many pixels each way; the image and its size reach the front
    end in one message."""
    png = _figure_png(figure)
    # the PNG header's size, rounded down: at least _PIXEL_RATIO image pixels per CSS pixel
    width, height = (int.from_bytes(png[at:at + 4], "big") // _PIXEL_RATIO for at in (16, 20))
    with area.hold_sync():
        area.value, area.width, area.height = png, str(width), str(height)


def _describe_plan(plan, without) -> str:  # noqa: ANN001 - AccumulationPlan pair
    """Return a one-line summary of ``plan`` against one pass ``without`` accumulation."""
    _check_kind("plan", plan, AccumulationPlan, "from plan_accumulation")
    _check_kind("without", without, AccumulationPlan, "from plan_accumulation")
    return (
        f"effective batch {plan.effective_batch_size} = {plan.micro_batch_size} x "
        f"{plan.accumulation_steps}: {plan.memory.total / MIB:.2f} MiB "
        f"(one pass: {without.memory.total / MIB:.2f} MiB), "
        f"{1e3 * plan.window_seconds:.2f} ms per step (one pass: "
        f"{1e3 * without.window_seconds:.2f} ms)"
    )


def accumulation_explorer(
    *,
    num_parameters: int,
    activation_bytes_per_sample: float,
    step_time: StepTimeModel,
    accumulation_steps: int = 4,
    micro_batch_size: int = 16,
    max_accumulation_steps: int = 32,
    max_micro_batch_size: int = 256,
    optimizer: Optimizer = "adamw",
    precision: Precision = "fp32",
) -> widgets.VBox:
    """Return sliders for k and the micro-batch size driving :func:`plan_accumulation`: a
    summary line and a figure of memory and time, against the same effective batch in one pass.
    The figure is an Image widget re-rendered on every change, so it works in any front end.
    """
    _check_kind("step_time", step_time, StepTimeModel, "e.g. from fit_step_time")
    _check_slider("accumulation_steps", accumulation_steps, max_accumulation_steps,
                  "max_accumulation_steps")
    _check_slider("micro_batch_size", micro_batch_size, max_micro_batch_size,
                  "max_micro_batch_size")
    steps = _int_slider(accumulation_steps, 1, max_accumulation_steps, "accumulation steps k")
    size = _int_slider(micro_batch_size, 1, max_micro_batch_size, "micro-batch size")
    summary = widgets.Label()
    figure_area = _figure_area()

    def plan(micro: int, k: int):  # noqa: ANN202
        return plan_accumulation(
            num_parameters=num_parameters, activation_bytes_per_sample=activation_bytes_per_sample,
            step_time=step_time, micro_batch_size=micro, accumulation_steps=k,
            optimizer=optimizer, precision=precision,
        )

    def redraw(_change: object = None) -> None:
        chosen = plan(size.value, steps.value)
        without = plan(chosen.effective_batch_size, 1)
        summary.value = _describe_plan(chosen, without)
        _show_figure(figure_area, plot_accumulation_plan(chosen, without))

    steps.observe(redraw, names="value")
    size.observe(redraw, names="value")
    redraw()
    return widgets.VBox([steps, size, summary, figure_area])


def _describe_cluster_plan(plan: ClusterPlan) -> str:
    """Return a one-line summary of a :class:`ClusterPlan`."""
    _check_kind("plan", plan, ClusterPlan, "from plan_cluster")
    verdict = "fits" if plan.fits else "does NOT fit"
    return (f"effective batch {plan.effective_batch_size}; per device "
            f"{plan.memory.total / 2**30:.1f} GiB + {plan.reserved_bytes / 2**30:.1f} GiB reserve"
            f" of {plan.device_bytes / 2**30:.0f} GiB: {verdict}")


# the cluster explorer's sliders: (plan_cluster's argument, lowest, highest, description)
_CLUSTER_SLIDERS = (("num_layers", 1, 96, "layers (model size)"),
                    ("sequence_length", 32, 2048, "sequence length"),
                    ("world_size", 1, 64, "GPUs"),
                    ("micro_batch_size", 1, 64, "micro-batch"),
                    ("accumulation_steps", 1, 64, "accumulation steps k"))


def cluster_explorer(
    shapes: dict[str, tuple[TransformerShape, Precision]],
    *,
    num_layers: int = 24,
    sequence_length: int = 512,
    micro_batch_size: int = 4,
    accumulation_steps: int = 8,
    world_size: int = 8,
    device_bytes: float = 16 * 2**30,
    reserved_bytes: float = 2**30,
) -> widgets.VBox:
    """Return controls (layers, sequence length, devices, micro-batch, k, precision) driving
    :func:`plan_cluster`, with a summary line and a per-device memory figure. ``shapes`` maps
    each precision choice shown to the shape measured in it and its memory layout.
    """
    values = {"num_layers": num_layers, "sequence_length": sequence_length,
              "world_size": world_size, "micro_batch_size": micro_batch_size,
              "accumulation_steps": accumulation_steps}
    _check_cluster_arguments(shapes, values, device_bytes, reserved_bytes)
    sliders = {name: _int_slider(values[name], low, high, description)
               for name, low, high, description in _CLUSTER_SLIDERS}
    precision = widgets.Dropdown(options=list(shapes), value=next(iter(shapes)),
                                 description="precision")
    summary = widgets.Label()
    figure_area = _figure_area()

    def redraw(_change: object = None) -> None:
        shape, layout = shapes[precision.value]
        plan = plan_cluster(shape, **{name: slider.value for name, slider in sliders.items()},
                            device_bytes=device_bytes, reserved_bytes=reserved_bytes,
                            precision=layout)
        summary.value = (f"{shape.num_parameters(sliders['num_layers'].value) / 1e6:.0f}M "
                         "parameters, " + _describe_cluster_plan(plan))
        _show_figure(figure_area, plot_cluster_plan(plan))

    controls = [*sliders.values(), precision]
    for control in controls:
        control.observe(redraw, names="value")
    redraw()
    return widgets.VBox([*controls, summary, figure_area])


def _check_cluster_arguments(shapes: object, values: dict[str, object], device_bytes: object,
                             reserved_bytes: object) -> None:
    """:func:`cluster_explorer`'s arguments: ``shapes`` a non-empty dict of pairs, each slider's
    start value inside its range (a slider would silently clamp it), the two byte counts."""
    if not isinstance(shapes, dict) or not shapes:
        raise ValueError("shapes must be a non-empty dict of name -> (TransformerShape, "
                         f"precision); got {shapes!r:.80}")
    for name, entry in shapes.items():
        if not (isinstance(entry, tuple) and len(entry) == 2
                and isinstance(entry[0], TransformerShape) and isinstance(entry[1], str)):
            raise TypeError(f"shapes[{name!r}] must be a pair (TransformerShape, precision); "
                            f"got {type(entry).__name__}")
    for name, low, high, _ in _CLUSTER_SLIDERS:
        check_int(name, values[name], low=low, high=high)
    check_number("device_bytes", device_bytes, low=0, low_open=True)
    check_number("reserved_bytes", reserved_bytes, low=0)


def _describe_ddp_step(model: DdpStepModel, accumulation_steps: int) -> str:
    """Return a one-line summary of the step time with one sync per window vs every micro-step."""
    _check_kind("model", model, DdpStepModel, "e.g. from fit_ddp_step_model")
    window = model.step_seconds(accumulation_steps, "window")
    every = model.step_seconds(accumulation_steps, "every")
    return (f"k={accumulation_steps}: communication {model.comm_fraction(accumulation_steps):.0%}"
            f" of the step when syncing once per window, "
            f"{model.comm_fraction(accumulation_steps, 'every'):.0%} when syncing every"
            f" micro-step; once per window is {every / window:.2f}x faster")


def ddp_time_explorer(
    compute_per_micro_step: float,
    *,
    comm_share: float = 0.6,
    accumulation_steps: int = 4,
    max_accumulation_steps: int = 32,
) -> widgets.VBox:
    """Return sliders for k and for the communication share of a k = 1 step, driving
    :class:`DdpStepModel` (compute per micro-step as measured)."""
    check_number("compute_per_micro_step", compute_per_micro_step, low=0, low_open=True)
    check_number("comm_share", comm_share, low=0, high=0.95)  # the slider's range
    _check_slider("accumulation_steps", accumulation_steps, max_accumulation_steps,
                  "max_accumulation_steps")
    steps = _int_slider(accumulation_steps, 1, max_accumulation_steps, "accumulation steps k")
    share = widgets.FloatSlider(value=comm_share, min=0.0, max=0.95, step=0.05,
                                description="communication share at k=1",
                                continuous_update=False, style=_SLIDER_STYLE,
                                layout=_slider_layout())
    summary = widgets.Label()
    figure_area = _figure_area()

    def redraw(_change: object = None) -> None:
        model = DdpStepModel.from_comm_share(compute_per_micro_step, share.value)
        summary.value = _describe_ddp_step(model, steps.value)
        _show_figure(figure_area, plot_ddp_step(model, steps.value))

    steps.observe(redraw, names="value")
    share.observe(redraw, names="value")
    redraw()
    return widgets.VBox([steps, share, summary, figure_area])


def _describe_learning_rates(base_lr: float, base_batch: int, batch: int,
                            measured: dict[tuple[int, str], float]) -> str:
    """Return the learning rate each rule gives at ``batch`` and, where measured, the result."""
    from gradaccum_lib.measure.noise import scaled_learning_rate

    _check_kind("measured", measured, dict, "(batch, rule) -> measured result")
    parts = []
    for rule in ("none", "linear", "sqrt"):
        lr = scaled_learning_rate(base_lr, base_batch, batch, rule)
        result = measured.get((batch, rule))
        parts.append(f"{rule}: lr {lr:.2e}" + (f" -> {result:.3f}" if result is not None else ""))
    return f"effective batch {batch}: " + "; ".join(parts)


def learning_rate_explorer(base_lr: float, base_batch: int, batches: list[int],
                           measured: dict[tuple[int, str], float]) -> widgets.VBox:
    """Return a slider over effective batches showing each scaling rule's learning rate and
    the measured validation loss it gave."""
    if not isinstance(batches, (list, tuple)) or not batches:
        raise ValueError(f"batches must be a non-empty list of effective batch sizes; got "
                         f"{batches!r}")
    for index, batch in enumerate(batches):
        check_positive_int(f"batches[{index}]", batch)
    if base_batch not in batches:
        raise ValueError(f"base_batch must be one of batches {list(batches)} (the slider starts "
                         f"there); got {base_batch!r}")
    _describe_learning_rates(base_lr, base_batch, base_batch, measured)  # checks the rest
    slider = widgets.SelectionSlider(options=batches, value=base_batch,
                                     description="effective batch", continuous_update=False,
                                     style=_SLIDER_STYLE, layout=_slider_layout())
    summary = widgets.Label()

    def redraw(_change: object = None) -> None:
        summary.value = _describe_learning_rates(base_lr, base_batch, slider.value, measured)

    slider.observe(redraw, names="value")
    redraw()
    return widgets.VBox([slider, summary])
