"""The explorer widget redraws from plan_accumulation; the memory and curve figures; a redrawn
figure is shown at its own size with twice as many pixels (sharp on a high-density screen)."""

from __future__ import annotations

import re

import pytest
from matplotlib.figure import Figure

from gradaccum_course.plots import plot_accumulation_plan, plot_curves, plot_memory_breakdown
from gradaccum_course.widgets import (
    _describe_plan,
    _figure_png,
    _show_figure,
    accumulation_explorer,
)
from gradaccum_lib.measure.memory import memory_budget
from gradaccum_lib.measure.planning import StepTimeModel, plan_accumulation

STEP_TIME = StepTimeModel(overhead_per_micro_step=0.002, seconds_per_sample=0.0001)


def _plan(micro_batch_size, accumulation_steps):
    return plan_accumulation(num_parameters=10_000, activation_bytes_per_sample=4096.0,
                             step_time=STEP_TIME, micro_batch_size=micro_batch_size,
                             accumulation_steps=accumulation_steps)


def test_explorer_shows_the_default_and_redraws_when_a_slider_moves():
    explorer = accumulation_explorer(num_parameters=10_000, activation_bytes_per_sample=4096.0,
                                     step_time=STEP_TIME, accumulation_steps=4,
                                     micro_batch_size=16)
    steps, size, summary, figure_area = explorer.children
    assert summary.value == _describe_plan(_plan(16, 4), _plan(64, 1))
    assert summary.value.startswith("effective batch 64 = 16 x 4")
    first_image = bytes(figure_area.value)
    assert first_image.startswith(b"\x89PNG")
    steps.value = 8
    assert summary.value == _describe_plan(_plan(16, 8), _plan(128, 1))
    assert bytes(figure_area.value) != first_image
    size.value = 2
    assert summary.value.startswith("effective batch 16 = 2 x 8")


def test_plot_accumulation_plan_and_memory_breakdown():
    figure = plot_accumulation_plan(_plan(16, 4), _plan(64, 1))
    assert isinstance(figure, Figure) and len(figure.axes) == 2
    breakdowns = {f"k={k}": memory_budget(1000, activation_bytes_per_sample=64 / k)
                  for k in (1, 2)}
    figure = plot_memory_breakdown(breakdowns, title="t")
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert legend == ["parameters", "gradients", "optimizer state", "activations"]
    with pytest.raises(ValueError, match="at least one MemoryBreakdown"):
        plot_memory_breakdown({})


def test_plot_curves_draws_every_curve_with_its_label():
    figure = plot_curves({"a": [3.0, 2.0, 1.0], "b": [3.0, 2.0, 1.0]}, xlabel="step",
                         ylabel="loss")
    assert [line.get_label() for line in figure.axes[0].get_lines()] == ["a", "b"]
    assert list(figure.axes[0].get_lines()[1].get_xdata()) == [1, 2, 3]
    with pytest.raises(ValueError, match="at least one curve"):
        plot_curves({}, xlabel="x", ylabel="y")


def test_figure_png_renders_in_memory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    png = _figure_png(plot_curves({"a": [1.0, 2.0]}, xlabel="x", ylabel="y"))
    assert png.startswith(b"\x89PNG") and list(tmp_path.iterdir()) == []


def test_every_slider_spans_most_of_the_notebook_width():
    from ipywidgets import widgets as ipw

    from gradaccum_course.widgets import (
        cluster_explorer,
        ddp_time_explorer,
        learning_rate_explorer,
    )
    from gradaccum_lib.measure.planning import TransformerShape, _TransformerActivations

    shape = TransformerShape(params_outside=10**6, params_per_layer=10**5,
                             activations=_TransformerActivations(1, 1, 1, 1, 1))
    explorers = [
        accumulation_explorer(num_parameters=10_000, activation_bytes_per_sample=4096.0,
                              step_time=STEP_TIME, accumulation_steps=4, micro_batch_size=16),
        ddp_time_explorer(0.001, comm_share=0.6, accumulation_steps=8),
        learning_rate_explorer(1e-3, 32, [32, 64], {}),
        cluster_explorer({"fp32": (shape, "fp32")}, num_layers=4, sequence_length=64,
                         micro_batch_size=2, accumulation_steps=2, world_size=2,
                         device_bytes=2**30),
    ]
    sliders = [child for explorer in explorers for child in explorer.children
               if isinstance(child, (ipw.IntSlider, ipw.FloatSlider, ipw.SelectionSlider))]
    assert len(sliders) >= 8
    assert len({(s.layout.width, s.layout.max_width) for s in sliders}) == 1  # one layout
    width, max_width = sliders[0].layout.width, sliders[0].layout.max_width
    assert width.endswith("%") and int(width.removesuffix("%")) >= 90
    assert int(max_width.removesuffix("px")) >= 600


def _png_size(png: bytes) -> tuple[int, int]:
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png[12:16] == b"IHDR"
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def _figure_explorers():
    from gradaccum_course.widgets import cluster_explorer, ddp_time_explorer
    from gradaccum_lib.measure.planning import TransformerShape, _TransformerActivations

    shape = TransformerShape(params_outside=10**6, params_per_layer=10**5,
                             activations=_TransformerActivations(1, 1, 1, 1, 1))
    return {
        "accumulation": accumulation_explorer(
            num_parameters=10_000, activation_bytes_per_sample=4096.0, step_time=STEP_TIME,
            accumulation_steps=4, micro_batch_size=16),
        "ddp": ddp_time_explorer(0.001, comm_share=0.6, accumulation_steps=8),
        "cluster": cluster_explorer({"fp32": (shape, "fp32")}, num_layers=4,
                                    sequence_length=64, micro_batch_size=2,
                                    accumulation_steps=2, world_size=2, device_bytes=2**30),
    }


@pytest.mark.parametrize("name", ["accumulation", "ddp", "cluster"])
def test_a_widget_figure_has_twice_the_pixels_of_its_displayed_size(name):
    """The notebook 05 figure was a 360 x 306 PNG stretched to 964 x 819 CSS pixels: now the
    Image is given its CSS size (so a VBox does not stretch it) and a PNG twice as large."""
    from ipywidgets import widgets as ipw

    explorer = _figure_explorers()[name]
    (image,) = [child for child in explorer.children if isinstance(child, ipw.Image)]
    slider = next(child for child in explorer.children if isinstance(child, ipw.IntSlider))
    for value in (slider.value, slider.min):  # as built, and redrawn by a slider
        slider.value = value
        shown = int(image.width), int(image.height)
        pixels = _png_size(bytes(image.value))
        assert 300 <= shown[0] <= 800 and 250 <= shown[1] <= 400, shown  # on a notebook page
        assert pixels[0] >= 2 * shown[0] and pixels[1] >= 2 * shown[1], (pixels, shown)
        assert abs(pixels[0] / pixels[1] - shown[0] / shown[1]) < 0.01  # not distorted
        assert image.layout.max_width == "100%"  # shrinks in proportion on a narrow page


def test_show_figure_sizes_the_image_as_the_figure_at_the_browsers_dpi():
    from ipywidgets import widgets as ipw

    figure = plot_curves({"a": [1.0, 2.0]}, xlabel="x", ylabel="y")
    image = ipw.Image(format="png")
    _show_figure(image, figure)
    # a browser's 96 CSS pixels to the inch: 6.4 x 3.6 in is 614.4 x 345.6
    width, height = figure.get_size_inches() * 96
    assert abs(int(image.width) - width) <= 1 and abs(int(image.height) - height) <= 1
    pixels = _png_size(bytes(image.value))
    assert pixels == _png_size(_figure_png(figure))
    assert pixels[0] >= 2 * int(image.width) and pixels[1] >= 2 * int(image.height)


@pytest.mark.parametrize("name", ["accumulation", "ddp", "cluster"])
def test_moving_each_explorers_slider_redraws_its_text_and_figure(name):
    """What the browser test checks by hand for 02 and 06 (tests/browser/test_sliders.py),
    checked in Python for every explorer with a figure: notebooks 02, 04 and 05 use them."""
    from ipywidgets import widgets as ipw

    explorer = _figure_explorers()[name]
    (text,) = [child for child in explorer.children if isinstance(child, (ipw.Label, ipw.HTML))]
    (image,) = [child for child in explorer.children if isinstance(child, ipw.Image)]
    slider = next(child for child in explorer.children if isinstance(child, ipw.IntSlider))
    before = text.value, bytes(image.value)
    slider.value = slider.max if slider.value != slider.max else slider.min
    assert text.value != before[0] and bytes(image.value) != before[1]


# ---- issue 49: fast moves end on the last values; the labels follow the reader's language;
# the first slider of 02 runs alone; the legend covers no bar

def _fast_moves(explorer, moves, draws):  # noqa: ANN001
    """Set each control of ``explorer`` to each move's values, faster than a redraw, inside a
    running event loop (as a kernel runs comm messages), and let the last move settle."""
    import asyncio

    from gradaccum_course import widgets

    async def move():
        for values in moves:
            for control, value in zip(explorer.children, values, strict=False):
                control.value = value
        assert len(draws) == 1, "a move was drawn before the moves settled"
        await asyncio.sleep(6 * widgets._SETTLE_S)

    asyncio.run(move())


def test_fast_moves_in_a_running_kernel_are_drawn_once_from_the_last_values(monkeypatch):
    """Issue 49: fast moves once left the text at "7 = 1 x 7" and the figure at "5 x 1". A
    redraw reads the sliders when it draws, and a move overtaken by a newer one is dropped."""
    from gradaccum_course import widgets

    draws = []
    real = widgets.plot_accumulation_plan
    monkeypatch.setattr(widgets, "plot_accumulation_plan", lambda plan, without: (
        draws.append((plan.accumulation_steps, plan.micro_batch_size)) or real(plan, without)))
    explorer = accumulation_explorer(num_parameters=10_000, activation_bytes_per_sample=4096.0,
                                     step_time=STEP_TIME, accumulation_steps=4,
                                     micro_batch_size=16)
    steps, size, summary, image = explorer.children
    _fast_moves(explorer, [(5, 1), (7, 3), (2, 8), (7, 1)], draws)
    assert draws == [(4, 16), (7, 1)]  # as built, then the last values once
    assert summary.value == _describe_plan(_plan(1, 7), _plan(7, 1))
    assert summary.value.startswith("effective batch 7 = 1 x 7")
    assert image._dom_classes == ("gradaccum-figure", "gradaccum-figure-k-7-b-1")
    assert bytes(image.value) == widgets._figure_png(real(_plan(1, 7), _plan(7, 1)))


@pytest.mark.parametrize("name", ["ddp", "cluster"])
def test_every_explorer_with_a_figure_ends_on_the_last_values(name, monkeypatch):
    from gradaccum_course import widgets

    draws = []
    for plot in ("plot_ddp_step", "plot_cluster_plan"):
        real = getattr(widgets, plot)
        monkeypatch.setattr(widgets, plot, lambda *args, real=real: draws.append(args) or
                            real(*args))
    explorer = _figure_explorers()[name]
    draws[:] = ["as built"]  # (the other explorers drew too, once each)
    slider = explorer.children[0]
    _fast_moves(explorer, [(slider.max,), (slider.min,), (slider.min + 1,)], draws)
    text, image = explorer.children[-2:]
    marker = image._dom_classes[-1]
    assert len(draws) == 2 and marker.startswith("gradaccum-figure-")
    if name == "ddp":  # k, the first slider, in the text and the figure's marker
        assert text.value.startswith("k=2:") and marker == "gradaccum-figure-k-2-share-0.6"
    else:  # layers, the first slider
        assert marker.startswith("gradaccum-figure-layers-2-") and "-k-2-" in marker


def test_the_learning_rate_explorer_ends_on_the_last_value():
    from gradaccum_course.widgets import _describe_learning_rates, learning_rate_explorer

    explorer = learning_rate_explorer(1e-3, 32, [16, 32, 64], {})
    draws = [None]  # the first drawing, when built
    _fast_moves(explorer, [(64,), (16,), (64,)], draws)
    assert explorer.children[1].value == _describe_learning_rates(1e-3, 32, 64, {})


def test_without_an_event_loop_a_move_is_drawn_at_once():
    explorer = accumulation_explorer(num_parameters=10_000, activation_bytes_per_sample=4096.0,
                                     step_time=STEP_TIME)
    steps, _, summary, image = explorer.children
    steps.value = 9
    assert " x 9:" in summary.value and image._dom_classes[-1].startswith("gradaccum-figure-k-9-")


def test_the_labels_follow_the_readers_language(monkeypatch, tmp_path):
    """A kernel started in notebooks/zh/ (gradaccum_course.language()) labels its sliders and
    says its summary in Chinese (docs/zh/glossary.md's terms), with the English numbers."""
    from gradaccum_course import language
    from gradaccum_course.widgets import ddp_time_explorer, localize_text

    monkeypatch.delenv("GRADACCUM_LANGUAGE", raising=False)
    (tmp_path / "notebooks" / "zh").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "notebooks" / "zh")
    assert language() == "zh"
    steps, size, summary, image = accumulation_explorer(
        num_parameters=10_000, activation_bytes_per_sample=4096.0, step_time=STEP_TIME,
        accumulation_steps=4, micro_batch_size=16).children
    assert (steps.description, size.description) == ("累积步数 k", "微批次大小")
    english = _describe_plan(_plan(16, 4), _plan(64, 1))
    assert summary.value == localize_text(english) != english
    assert summary.value.startswith("有效批大小 64 = 16 x 4：显存 ")
    assert image._dom_classes[-1] == "gradaccum-figure-k-4-b-16"  # a marker, in no language
    assert ddp_time_explorer(0.001).children[0].description == "累积步数 k"
    monkeypatch.chdir(tmp_path)
    assert language() == "en" and accumulation_explorer(
        num_parameters=10, activation_bytes_per_sample=1.0,
        step_time=STEP_TIME).children[0].description == "accumulation steps k"


def test_every_widget_text_has_a_chinese_twin_with_the_same_fields():
    import string

    from gradaccum_course.widgets import _PARTS, _TEXTS, localize_text

    for key, text in {**_TEXTS, **dict(enumerate(_PARTS))}.items():
        fields = {f for _, f, _, _ in string.Formatter().parse(text.english) if f}
        assert fields == {f for _, f, _, _ in string.Formatter().parse(text.chinese) if f}, key
        assert not any(spec for _, _, spec, _ in string.Formatter().parse(text.chinese)), key
    assert localize_text("some other text") == "some other text"
    assert localize_text("accumulation steps k", "en") == "accumulation steps k"
    stored_06 = ("effective batch 32: none: lr 2.00e-03 -> 1.915; linear: lr 2.00e-03; sqrt: "
                 "lr 2.00e-03 -> 1.915")
    assert localize_text(stored_06) == (
        "有效批大小 32：不缩放：学习率 2.00e-03 -> 1.915；线性缩放：学习率 2.00e-03；"
        "平方根缩放：学习率 2.00e-03 -> 1.915")
    assert localize_text("326M parameters, effective batch 256; per device 12.7 GiB + 1.0 GiB "
                         "reserve of 16 GiB: does NOT fit").endswith("显存共 16 GiB：放不下")


@pytest.mark.parametrize(("micro_batch_size", "accumulation_steps"),
                         [(1, 1), (1, 7), (1, 32), (16, 4), (64, 4), (256, 1), (256, 32)])
def test_the_legend_covers_no_bar_for_any_slider_value(micro_batch_size, accumulation_steps):
    """Issue 49: the memory legend covered the bar at micro-batch 1; it now sits below both
    panels, outside the axes."""
    plan = _plan(micro_batch_size, accumulation_steps)
    figure = plot_accumulation_plan(plan, _plan(plan.effective_batch_size, 1))
    figure.draw_without_rendering()
    (legend,) = figure.legends
    box = legend.get_window_extent()
    assert [text.get_text() for text in legend.get_texts()] == [
        "parameters", "gradients", "optimizer state", "activations"]
    for axes in figure.axes:
        assert axes.get_legend() is None and not box.overlaps(axes.get_window_extent())
        assert not any(box.overlaps(bar.get_window_extent()) for bar in axes.patches)
    assert tuple(figure.get_size_inches()) == (8.0, 3.4)  # two panels of plot_ddp_step's size


def test_notebook_02s_first_slider_runs_alone_on_section_1s_model():
    """The slider at 02's top has its own imports and inputs (nothing else runs first), and
    its two memory inputs are section 1's wide MLP at the ci sizes, as its comment says."""
    import json
    from pathlib import Path

    import torch
    from ipywidgets import widgets as ipw

    from gradaccum_lib.losses import sample_classification_loss
    from gradaccum_lib.measure.memory import activation_bytes
    from gradaccum_lib.runtime import get_profile
    from gradaccum_lib.workloads.data import make_toy_classification
    from gradaccum_lib.workloads.models import make_mlp

    notebook = Path(__file__).resolve().parents[1] / "notebooks" / "02_single_device.ipynb"
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    first_code = next(cell for cell in cells if cell["cell_type"] == "code")
    assert first_code["id"] == "abee98c0"
    namespace: dict = {}
    exec(compile("".join(first_code["source"]), "abee98c0", "exec"), namespace)  # noqa: S102
    source = "".join(first_code["source"])
    call = source[source.index("accumulation_explorer("):]
    explorer = eval(call, namespace)  # noqa: S307 - the cell's own last expression
    assert isinstance(explorer, ipw.VBox)
    inputs = {name: float(value.replace("_", "")) for name, value in re.findall(
        r"(num_parameters|activation_bytes_per_sample)=([\d_.]+)", source)}
    ci = get_profile("ci")
    model = make_mlp(ci.input_dim, ci.wide_hidden_dim, ci.num_classes, seed=0,
                     dtype=torch.float32)
    batch = make_toy_classification(ci.effective_batch_size, ci.input_dim, ci.num_classes,
                                    seed=0, dtype=torch.float32)
    per_sample = activation_bytes(model, sample_classification_loss, batch) / len(batch[1])
    assert inputs["num_parameters"] == sum(p.numel() for p in model.parameters())
    assert abs(inputs["activation_bytes_per_sample"] - per_sample) <= 0.01 * per_sample
