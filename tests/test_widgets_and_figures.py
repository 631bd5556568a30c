"""The explorer widget redraws from plan_accumulation; the memory and curve figures; a redrawn
figure is shown at its own size with twice as many pixels (sharp on a high-density screen)."""

from __future__ import annotations

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
