"""ipywidgets controls bound to pure library functions.

Each control calls a pure function of the library and redraws from its result, so whatever a
slider shows is what the tested function returns. Without a front end, the notebook shows the
default (the function is called once when the control is built).

A redraw reads every control's value when it draws, never the value that triggered it; in a
running kernel it waits a moment (_SETTLE_S) and is dropped when a newer move has come in, so
fast moves end on the last values, in the text and in the figure (whose CSS class names them,
set in the same message as the image: a browser test reads it). Labels and texts follow the
reader's language (:func:`gradaccum_course.language`); :func:`localize_text` says a stored
English one in Chinese (scripts/build_twins.py puts it in the twins' stored widget state).
"""

from __future__ import annotations

import asyncio
import io
import re
import string
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

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

from . import language
from .denominator_lab import (
    NORMALISATIONS,
    PRESETS,
    WindowMeasurement,
    format_layout,
    measure_window,
    parse_layout,
    percent,
    plot_window,
    preset_layout,
)
from .plots import MIB, plot_accumulation_plan, plot_cluster_plan, plot_ddp_step

__all__ = [
    "accumulation_explorer",
    "ddp_time_explorer",
    "cluster_explorer",
    "learning_rate_explorer",
    "denominator_lab",
    "localize_text",
]


@dataclass(frozen=True)
class _Text:
    """A widget text in both languages: an English format string, and a Chinese one with the
    same fields and no format specs. The Chinese is filled with the values the English text
    printed (read back from it), so a live kernel and a twin's stored state say the same."""

    english: str
    chinese: str

    @cached_property
    def pattern(self) -> re.Pattern[str]:
        """The English text as a pattern whose groups read its fields' printed values."""
        pattern = ""
        for literal, field, _, _ in string.Formatter().parse(self.english):
            pattern += re.escape(literal) + (f"(?P<{field}>.+?)" if field is not None else "")
        return re.compile(pattern)

    def say(self, lang: str, **values: object) -> str:
        """The text filled with ``values``, in ``lang`` (``"en"`` or ``"zh"``)."""
        english = self.english.format(**values)
        return (self.in_chinese(english) or english) if lang == "zh" else english

    def in_chinese(self, english: str) -> str | None:
        """``english`` (this text, filled) said in Chinese, or None if it is not this text."""
        found = self.pattern.fullmatch(english)
        if found is None:
            return None
        printed = {name: _WORDS_ZH.get(value, value) for name, value in found.groupdict().items()}
        if "plan" in printed:  # another of _TEXTS, inside this one
            printed["plan"] = localize_text(printed["plan"], "zh")
        if "parts" in printed:  # a list of parts, each one of _PARTS, joined by "; "
            printed["parts"] = "；".join(next((said for part in _PARTS if (
                said := part.in_chinese(one)) is not None), one)
                for one in found["parts"].split("; "))
        return self.chinese.format(**printed)


#: words a text prints as a value, in Chinese
_WORDS_ZH = {"fits": "放得下", "does NOT fit": "放不下", "none": "不缩放", "linear": "线性缩放",
             "sqrt": "平方根缩放"}
#: every text the explorers show: slider descriptions and summaries
_TEXTS: dict[str, _Text] = {
    "k": _Text("accumulation steps k", "累积步数 k"),
    "micro-batch size": _Text("micro-batch size", "微批次大小"),
    "plan": _Text(
        "effective batch {effective} = {micro} x {k}: {memory:.2f} MiB (one pass: "
        "{memory_one_pass:.2f} MiB), {ms:.2f} ms per step (one pass: {ms_one_pass:.2f} ms)",
        "有效批大小 {effective} = {micro} x {k}：显存 {memory} MiB"
        "（不累积：{memory_one_pass} MiB），每步耗时 {ms} ms（不累积：{ms_one_pass} ms）"),
    "layers": _Text("layers (model size)", "层数（模型大小）"),
    "sequence length": _Text("sequence length", "序列长度"),
    "GPUs": _Text("GPUs", "GPU 数"),
    "micro-batch": _Text("micro-batch", "微批次"),
    "precision": _Text("precision", "精度"),
    "cluster": _Text(
        "effective batch {effective}; per device {memory:.1f} GiB + {reserved:.1f} GiB reserve "
        "of {device:.0f} GiB: {verdict}",
        "有效批大小 {effective}；每个设备 {memory} GiB + 预留 {reserved} GiB，显存共 {device} GiB："
        "{verdict}"),
    "cluster summary": _Text("{parameters:.0f}M parameters, {plan}",
                             "{parameters}M 个参数，{plan}"),
    "share": _Text("communication share at k=1", "k=1 时通信所占比例"),
    "ddp": _Text(
        "k={k}: communication {window:.0%} of the step when syncing once per window, "
        "{every:.0%} when syncing every micro-step; once per window is {speedup:.2f}x faster",
        "k={k}：每个窗口同步一次时，通信占每步耗时的 {window}；每个微步都同步时占 {every}；"
        "每个微步都同步的耗时是每个窗口同步一次的 {speedup}x"),
    "effective batch": _Text("effective batch", "有效批大小"),
    # the denominator lab (notebook 03)
    "ranks": _Text("ranks", "进程数"),
    "start from": _Text("start from", "起点"),
    "tokens": _Text("tokens", "token 数"),
    "tokens help": _Text(
        "one line per rank; micro-batches separated by spaces; a micro-batch's sequences "
        "joined by + (their real tokens)",
        "每行一个进程；微批次之间用空格分隔；同一微批次的各条序列用 + 连接（各自的真实 token 数）"),
    **{name: _Text(name, chinese) for name, chinese in zip(
        NORMALISATIONS + PRESETS,
        ("微批次均值的均值", "求和损失 / k", "本进程计数", "按样本", "窗口全局 token 数",
         "token 数不均", "token 数相等", "一个进程只有填充", "最后一个不满的窗口"), strict=True)},
    "window": _Text("{ranks} rank(s), k = {k}: {tokens} real tokens in {sequences} sequences",
                    "{ranks} 个进程，k = {k}：{sequences} 条序列共 {tokens} 个真实 token"),
    "update error": _Text("the update's error against the large batch's gradient",
                          "更新相对大批次梯度的误差"),
    "exact": _Text("exact to 1e-9", "精确到 1e-9"),
    "logged": _Text(
        "logged loss: rank 0's last micro-batch {last}; mean of micro-batch means {means}; "
        "the window's token-weighted mean {true} (the true one)",
        "记录的损失：0 号进程最后一个微批次 {last}；微批次均值的均值 {means}；"
        "窗口按 token 加权的均值 {true}（真实值）"),
    "lab figure": _Text(
        "Figure: left, the weight of each sequence's tokens under normalisation 1-5 over the "
        "right weight (log2: 0 is right; grey: a sequence without a real token; columns: rank, "
        "micro-batch: real tokens); right, each update's error.",
        "图：左边是在归一化方式 1-5 下各序列 token 的权重与正确权重之比（log2：0 表示正确；"
        "灰色：没有真实 token 的序列；列：进程、微批次：真实 token 数）；右边是每种更新的误差。"),
    "rates": _Text("effective batch {batch}: {parts}", "有效批大小 {batch}：{parts}"),
}
#: the parts of the "rates" text: a rule's learning rate, and the result measured with it
_PARTS = (_Text("{rule}: lr {lr:.2e} -> {result:.3f}", "{rule}：学习率 {lr} -> {result}"),
          _Text("{rule}: lr {lr:.2e}", "{rule}：学习率 {lr}"))


def localize_text(text: str, lang: str = "zh") -> str:
    """Return ``text``, a slider's label or a summary an explorer shows in English, said in
    ``lang`` (the same numbers); a text of no explorer is returned as it is."""
    if lang != "zh":
        return text
    return next((said for known in _TEXTS.values()
                 if (said := known.in_chinese(text)) is not None), text)


def _say(key: str, lang: str, **values: object) -> str:
    return _TEXTS[key].say(lang, **values)


# A move waits _SETTLE_S for a newer one before it is drawn: moves that come faster than a
# figure renders (~0.1-0.3 s) are drawn once, at the last values, not one after another.
_SETTLE_S = 0.05


def _redraw_on_change(controls: Sequence[widgets.ValueWidget], draw: Callable[[], None]) -> None:
    """Call ``draw()`` now and after each change of a control's value. ``draw`` reads the
    controls' current values. In a running kernel (an event loop runs the comm messages) a
    change is drawn _SETTLE_S later, unless a newer change came in meanwhile: a stale update is
    dropped, never drawn after a newer one. Without an event loop (a script, a test), at once."""
    changes = [0]

    def draw_if_latest(change_number: int) -> None:
        if change_number == changes[0]:
            draw()

    def changed(_change: object) -> None:
        changes[0] += 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            draw()
            return
        loop.call_later(_SETTLE_S, draw_if_latest, changes[0])

    for control in controls:
        control.observe(changed, names="value")
    draw()


# a slider's track spans most of the notebook's width (ipywidgets' default is ~60 px of track
# for a long description), so a 1-256 range can be set with a mouse
_SLIDER_WIDTH = "95%"
_SLIDER_MAX_WIDTH = "760px"
_SLIDER_STYLE = {"description_width": "initial"}


def _slider_layout() -> widgets.Layout:
    return widgets.Layout(width=_SLIDER_WIDTH, max_width=_SLIDER_MAX_WIDTH)


def _int_slider(value: int, low: int, high: int, description: str) -> widgets.IntSlider:
    """An IntSlider that sends its value when released (``description`` as shown)."""
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


def _figure_class(**shown: object) -> str:
    """The CSS class that names the values a figure shows: ``gradaccum-figure-k-7-b-1``."""
    printed = {name: f"{value:g}" if isinstance(value, float) else str(value)
               for name, value in shown.items()}
    return "gradaccum-figure-" + "-".join(f"{name}-" + re.sub(r"[^\w.]+", "_", value)
                                          for name, value in printed.items())


def _show_figure(area: widgets.Image, figure: Figure, **shown: object) -> None:
    """Show ``figure`` in ``area`` at its size in CSS pixels (figure inches x _CSS_DPI), from a
    PNG with _PIXEL_RATIO times as many pixels each way. The image, its size and a CSS class
    naming the values ``shown`` (:func:`_figure_class`, which a browser test reads; a tooltip
    would not do: ipywidgets 8.1's Image view throws on one) reach the front end in one
    message, so they never disagree."""
    png = _figure_png(figure)
    # the PNG header's size, rounded down: at least _PIXEL_RATIO image pixels per CSS pixel
    width, height = (int.from_bytes(png[at:at + 4], "big") // _PIXEL_RATIO for at in (16, 20))
    with area.hold_sync():
        area.value, area.width, area.height = png, str(width), str(height)
        if shown:
            area._dom_classes = ("gradaccum-figure", _figure_class(**shown))


def _describe_plan(plan, without, lang: str = "en") -> str:  # noqa: ANN001 - AccumulationPlan
    """Return a one-line summary of ``plan`` against one pass ``without`` accumulation."""
    _check_kind("plan", plan, AccumulationPlan, "from plan_accumulation")
    _check_kind("without", without, AccumulationPlan, "from plan_accumulation")
    return _say("plan", lang, effective=plan.effective_batch_size, micro=plan.micro_batch_size,
                k=plan.accumulation_steps, memory=plan.memory.total / MIB,
                memory_one_pass=without.memory.total / MIB, ms=1e3 * plan.window_seconds,
                ms_one_pass=1e3 * without.window_seconds)


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
    lang = language()
    steps = _int_slider(accumulation_steps, 1, max_accumulation_steps, _say("k", lang))
    size = _int_slider(micro_batch_size, 1, max_micro_batch_size, _say("micro-batch size", lang))
    summary = widgets.Label()
    figure_area = _figure_area()

    def plan(micro: int, k: int):  # noqa: ANN202
        return plan_accumulation(
            num_parameters=num_parameters, activation_bytes_per_sample=activation_bytes_per_sample,
            step_time=step_time, micro_batch_size=micro, accumulation_steps=k,
            optimizer=optimizer, precision=precision,
        )

    def draw() -> None:
        micro, k = size.value, steps.value  # the sliders' values now, whatever moved
        chosen = plan(micro, k)
        without = plan(chosen.effective_batch_size, 1)
        summary.value = _describe_plan(chosen, without, lang)
        _show_figure(figure_area, plot_accumulation_plan(chosen, without), k=k, b=micro)

    _redraw_on_change([steps, size], draw)
    return widgets.VBox([steps, size, summary, figure_area])


def _describe_cluster_plan(plan: ClusterPlan, num_parameters: float | None = None,
                           lang: str = "en") -> str:
    """Return a one-line summary of a :class:`ClusterPlan`, led by the model's parameter count
    where ``num_parameters`` is given."""
    _check_kind("plan", plan, ClusterPlan, "from plan_cluster")
    english = _TEXTS["cluster"].english.format(
        effective=plan.effective_batch_size, memory=plan.memory.total / 2**30,
        reserved=plan.reserved_bytes / 2**30, device=plan.device_bytes / 2**30,
        verdict="fits" if plan.fits else "does NOT fit")
    if num_parameters is None:
        return localize_text(english, lang)
    return _say("cluster summary", lang, parameters=num_parameters / 1e6, plan=english)


# the cluster explorer's sliders: (plan_cluster's argument, lowest, highest, its text's key)
_CLUSTER_SLIDERS = (("num_layers", 1, 96, "layers"),
                    ("sequence_length", 32, 2048, "sequence length"),
                    ("world_size", 1, 64, "GPUs"),
                    ("micro_batch_size", 1, 64, "micro-batch"),
                    ("accumulation_steps", 1, 64, "k"))


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
    lang = language()
    sliders = {name: _int_slider(values[name], low, high, _say(key, lang))
               for name, low, high, key in _CLUSTER_SLIDERS}
    precision = widgets.Dropdown(options=list(shapes), value=next(iter(shapes)),
                                 description=_say("precision", lang))
    summary = widgets.Label()
    figure_area = _figure_area()

    def draw() -> None:
        chosen = {name: slider.value for name, slider in sliders.items()}  # the values now
        shape, layout = shapes[precision.value]
        plan = plan_cluster(shape, **chosen, device_bytes=device_bytes,
                            reserved_bytes=reserved_bytes, precision=layout)
        summary.value = _describe_cluster_plan(plan, shape.num_parameters(chosen["num_layers"]),
                                               lang)
        _show_figure(figure_area, plot_cluster_plan(plan), layers=chosen["num_layers"],
                     sequence=chosen["sequence_length"], gpus=chosen["world_size"],
                     b=chosen["micro_batch_size"], k=chosen["accumulation_steps"],
                     precision=precision.value)

    controls = [*sliders.values(), precision]
    _redraw_on_change(controls, draw)
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


def _describe_ddp_step(model: DdpStepModel, accumulation_steps: int, lang: str = "en") -> str:
    """Return a one-line summary of the step time with one sync per window vs every micro-step."""
    _check_kind("model", model, DdpStepModel, "e.g. from fit_ddp_step_model")
    window = model.step_seconds(accumulation_steps, "window")
    every = model.step_seconds(accumulation_steps, "every")
    return _say("ddp", lang, k=accumulation_steps, window=model.comm_fraction(accumulation_steps),
                every=model.comm_fraction(accumulation_steps, "every"), speedup=every / window)


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
    lang = language()
    steps = _int_slider(accumulation_steps, 1, max_accumulation_steps, _say("k", lang))
    share = widgets.FloatSlider(value=comm_share, min=0.0, max=0.95, step=0.05,
                                description=_say("share", lang),
                                continuous_update=False, style=_SLIDER_STYLE,
                                layout=_slider_layout())
    summary = widgets.Label()
    figure_area = _figure_area()

    def draw() -> None:
        k, chosen_share = steps.value, share.value  # the sliders' values now, whatever moved
        model = DdpStepModel.from_comm_share(compute_per_micro_step, chosen_share)
        summary.value = _describe_ddp_step(model, k, lang)
        _show_figure(figure_area, plot_ddp_step(model, k), k=k, share=chosen_share)

    _redraw_on_change([steps, share], draw)
    return widgets.VBox([steps, share, summary, figure_area])


def _describe_learning_rates(base_lr: float, base_batch: int, batch: int,
                            measured: dict[tuple[int, str], float], lang: str = "en") -> str:
    """Return the learning rate each rule gives at ``batch`` and, where measured, the result."""
    from gradaccum_lib.measure.noise import scaled_learning_rate

    _check_kind("measured", measured, dict, "(batch, rule) -> measured result")
    parts = []
    for rule in ("none", "linear", "sqrt"):
        lr = scaled_learning_rate(base_lr, base_batch, batch, rule)
        result = measured.get((batch, rule))
        parts.append(_PARTS[0].english.format(rule=rule, lr=lr, result=result) if result is not None
                     else _PARTS[1].english.format(rule=rule, lr=lr))
    return _say("rates", lang, batch=batch, parts="; ".join(parts))


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
    lang = language()
    slider = widgets.SelectionSlider(options=batches, value=base_batch,
                                     description=_say("effective batch", lang),
                                     continuous_update=False, style=_SLIDER_STYLE,
                                     layout=_slider_layout())
    summary = widgets.Label()

    def draw() -> None:
        summary.value = _describe_learning_rates(base_lr, base_batch, slider.value, measured,
                                                 lang)

    _redraw_on_change([slider], draw)
    return widgets.VBox([slider, summary])


def _lab_report(measurement: WindowMeasurement, lang: str) -> str:
    """The lab's HTML: the window, each normalisation's update error, the three logged losses;
    each text node one of _TEXTS (scripts/build_twins.py says a stored one in Chinese)."""
    sequences = [n for rank in measurement.layout for micro in rank for n in micro]
    rows = "".join(
        f"<tr><td>{row}</td><td>{_say(name, lang)}</td><td style='text-align:right'>"
        f"{_say('exact', lang) if error < 1e-9 else percent(error)}</td></tr>"
        for row, (name, error) in enumerate(measurement.errors.items(), start=1))
    logged = {key: "NaN" if value != value else f"{value:.3f}"  # NaN: a mean over no token
              for key, value in zip(("last", "means", "true"), measurement.logged.values(),
                                    strict=True)}
    window = _say("window", lang, ranks=len(measurement.layout), sequences=len(sequences),
                  k=measurement.accumulation_steps, tokens=sum(sequences))
    return (f"<p>{window}</p><table><tr><th>#</th><th></th><th>{_say('update error', lang)}"
            f"</th></tr>{rows}</table><p>{_say('logged', lang, **logged)}</p>"
            f"<p>{_say('lab figure', lang)}</p>")


def denominator_lab(*, ranks: int = 2, accumulation_steps: int = 4,
                    preset: str = "uneven tokens") -> widgets.VBox:
    """Return the denominator lab (notebook 03): sliders for the ranks (1-4) and k (1-8), a
    preset, and the window's real tokens as editable text; a table of each normalisation's
    update error (:func:`~gradaccum_course.denominator_lab.measure_window`, against the
    library's large-batch gradient) and three logged losses, and the weights' figure. Moving
    a slider or choosing a preset rewrites the text from the preset; editing the text measures
    that window. A text that is not a window says why, in place of the table."""
    check_int("ranks", ranks, low=1, high=4)
    check_int("accumulation_steps", accumulation_steps, low=1, high=8)
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {PRESETS}; got {preset!r}")
    lang = language()
    rank_slider = _int_slider(ranks, 1, 4, _say("ranks", lang))
    k_slider = _int_slider(accumulation_steps, 1, 8, _say("k", lang))
    choice = widgets.Dropdown(options=[(_say(name, lang), name) for name in PRESETS],
                              value=preset, description=_say("start from", lang),
                              style=_SLIDER_STYLE)
    tokens = widgets.Textarea(description=_say("tokens", lang),
                              placeholder=_say("tokens help", lang), rows=4,
                              continuous_update=False, style=_SLIDER_STYLE,
                              layout=_slider_layout())
    report, figure_area = widgets.HTML(), _figure_area()

    def from_preset(_change: object = None) -> None:
        tokens.value = format_layout(preset_layout(choice.value, rank_slider.value,
                                                   k_slider.value))

    def draw() -> None:
        k = k_slider.value  # the controls' values now, whatever moved
        try:
            measurement = measure_window(parse_layout(tokens.value, k), k)
        except ValueError as error:
            report.value = f"<p style='color:#b00'>{error}</p>"
            return
        report.value = _lab_report(measurement, lang)
        # the figure's marker names the window it draws (a browser test reads it)
        _show_figure(figure_area, plot_window(measurement), ranks=len(measurement.layout), k=k,
                     window=zlib.crc32(format_layout(measurement.layout).encode()))

    for control in (rank_slider, k_slider, choice):
        control.observe(from_preset, names="value")
    from_preset()
    _redraw_on_change([tokens], draw)
    return widgets.VBox([rank_slider, k_slider, choice, tokens, report, figure_area])
