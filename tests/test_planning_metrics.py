"""Transformer activation fits, device planning, BERT shapes, metrics, the cluster widget and
the DDP step-time fit (notebook 05 times the steps it fits)."""

from __future__ import annotations

import pytest
import torch

from gradaccum_course.plots import plot_cluster_plan
from gradaccum_course.widgets import _describe_cluster_plan, cluster_explorer
from gradaccum_lib.measure.memory import memory_budget
from gradaccum_lib.measure.metrics import classification_scores, predict_classes
from gradaccum_lib.measure.planning import (
    DdpStepModel,
    TransformerShape,
    _TransformerActivations,
    accumulation_steps_for,
    ddp_relative_residuals,
    fit_ddp_step_model,
    fit_transformer_activations,
    max_micro_batch_size,
    measure_bert_shape,
    plan_cluster,
)
from gradaccum_lib.workloads.models import (
    ROBERTA_WWM_EXT_LARGE,
    count_bert_parameters,
    make_tiny_bert,
)

TRUE = _TransformerActivations(outside_fixed=100.0, outside_per_token=8.0, per_layer_fixed=50.0,
                              per_layer_per_token=30.0, per_layer_per_token_squared=2.0)


def _measure(num_layers, length):  # what a sample of TRUE would measure
    return int(TRUE.fixed_bytes(num_layers) + TRUE.bytes_per_sample(length, num_layers))


def test_fit_recovers_every_term_of_a_known_model():
    fitted = fit_transformer_activations(_measure)
    for name in _TransformerActivations.__dataclass_fields__:
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE, name), abs=1e-6)
    assert fitted.bytes_for(3, 256, 12) == pytest.approx(TRUE.bytes_for(3, 256, 12))
    with pytest.raises(ValueError, match="three increasing positive ints"):
        fit_transformer_activations(_measure, lengths=(64, 32, 128))


def test_max_micro_batch_size_and_accumulation_steps():
    # 100 params fp32 AdamW = 1600 bytes; 1000 - 1600 < 0: nothing fits
    assert max_micro_batch_size(1000, 100, 10.0) == 0
    assert max_micro_batch_size(2000, 100, 10.0, reserved_bytes=100) == 30
    assert max_micro_batch_size(2000, 100, 10.0, activation_bytes_fixed=300) == 10
    with pytest.raises(ValueError, match="activation_bytes_per_sample must be > 0"):
        max_micro_batch_size(2000, 100, 0.0)
    assert accumulation_steps_for(256, 4, world_size=8) == 8
    assert accumulation_steps_for(256, 5, world_size=8) == 7  # 280 >= 256
    with pytest.raises(ValueError, match="world_size must be a positive int; got 0"):
        accumulation_steps_for(256, 4, world_size=0)


def test_plan_cluster_memory_effective_batch_and_fit():
    shape = TransformerShape(params_outside=1000, params_per_layer=100, activations=TRUE)
    assert shape.num_parameters(4) == 1400
    plan = plan_cluster(shape, num_layers=4, sequence_length=16, micro_batch_size=2,
                        accumulation_steps=3, world_size=5, device_bytes=1e6)
    expected = memory_budget(1400, activation_bytes_per_sample=TRUE.bytes_per_sample(16, 4),
                             micro_batch_size=2, activation_bytes_fixed=TRUE.fixed_bytes(4))
    assert plan.memory == expected and plan.effective_batch_size == 30 and plan.fits
    tight = plan_cluster(shape, num_layers=4, sequence_length=16, micro_batch_size=2,
                         accumulation_steps=3, world_size=5, device_bytes=expected.total,
                         reserved_bytes=1)
    assert not tight.fits
    assert "does NOT fit" in _describe_cluster_plan(tight)
    with pytest.raises(ValueError, match="num_layers must be a positive int; got 0"):
        plan_cluster(shape, num_layers=0, sequence_length=16, micro_batch_size=2,
                     accumulation_steps=3, world_size=5, device_bytes=1e6)


def test_count_bert_parameters_of_the_published_large_config():
    assert 320e6 < count_bert_parameters(ROBERTA_WWM_EXT_LARGE, num_labels=10) < 330e6


def test_measure_bert_shape_predicts_a_measurement_outside_its_fit():
    from transformers import BertConfig, BertForSequenceClassification

    from gradaccum_lib.losses import bert_classification_loss
    from gradaccum_lib.measure.memory import activation_bytes

    small = {"vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 128,
             "type_vocab_size": 2}
    shape = measure_bert_shape(small, num_labels=3)
    assert shape.num_parameters(2) == count_bert_parameters(small, num_labels=3)
    model = BertForSequenceClassification(BertConfig(**{**small, "num_hidden_layers": 3},
                                                     num_labels=3))
    ids = torch.randint(5, 300, (2, 96), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "labels": torch.zeros(2, dtype=torch.long)}
    measured = activation_bytes(model, bert_classification_loss, batch)
    assert shape.activations.bytes_for(2, 96, 3) == pytest.approx(measured, rel=0.02)


def test_classification_scores_by_hand():
    predictions = torch.tensor([0, 0, 1, 2, 2, 2])
    labels = torch.tensor([0, 1, 1, 2, 2, 0])
    scores = classification_scores(predictions, labels, num_classes=4)
    assert scores["accuracy"] == pytest.approx(4 / 6)
    assert scores["f1"] == pytest.approx([0.5, 2 / 3, 0.8, 0.0])
    assert scores["macro_f1"] == pytest.approx((0.5 + 2 / 3 + 0.8) / 4)
    with pytest.raises(ValueError, match="must be equal 1-dim shapes"):
        classification_scores(predictions, labels[:3], num_classes=4)
    with pytest.raises(ValueError, match="labels is empty"):
        classification_scores(torch.tensor([]), torch.tensor([]), num_classes=2)


def test_predict_classes_in_micro_batches_restores_the_mode():
    model = make_tiny_bert(50, 3, hidden_size=16, max_length=16, dropout=0.1).train()
    ids = torch.randint(5, 50, (10, 16), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    predictions = predict_classes(model, batch, micro_batch_size=3)
    model.eval()
    with torch.no_grad():
        expected = model(**batch).logits.argmax(-1)
    assert torch.equal(predictions, expected)
    model.train()
    predict_classes(model, batch)
    assert model.training


def test_cluster_explorer_redraws_on_every_control():
    shape = TransformerShape(params_outside=10**6, params_per_layer=10**5, activations=TRUE)
    explorer = cluster_explorer({"fp32": (shape, "fp32"), "mixed": (shape, "mixed")},
                                num_layers=4, sequence_length=64, micro_batch_size=2,
                                accumulation_steps=2, world_size=2, device_bytes=2**30)
    *controls, summary, image = explorer.children
    first = (summary.value, bytes(image.value))
    assert summary.value.startswith("1M parameters, effective batch 8")
    controls[4].value = 5  # k
    assert "effective batch 20" in summary.value
    controls[5].value = "mixed"
    assert bytes(image.value) != first[1]
    assert len(plot_cluster_plan(plan_cluster(
        shape, num_layers=1, sequence_length=8, micro_batch_size=1, accumulation_steps=1,
        world_size=1, device_bytes=2**30)).axes) == 1


# ---- the DDP step-time fit and its interleaved timings -----------------------------------

KS = [1, 2, 4, 8]


def _relative_design(ks, window, every):
    rows = [[k, s, 1.0] for k in ks for s in (1, k)]
    times = [t for pair in zip(window, every, strict=True) for t in pair]
    design = (torch.tensor(rows, dtype=torch.float64)
              / torch.tensor(times, dtype=torch.float64)[:, None])
    return design, torch.ones(len(times), dtype=torch.float64)


def test_fit_ddp_step_model_is_the_nonnegative_least_squares_optimum():
    # a negative optimizer term fits these times best: it must be held at 0, the rest refitted
    truth = DdpStepModel(0.002, 0.003, 0.0)
    window = [truth.step_seconds(k, "window") - 0.0015 for k in KS]
    every = [truth.step_seconds(k, "every") - 0.0015 for k in KS]
    fitted = fit_ddp_step_model(KS, window, every)
    x = torch.tensor([fitted.compute_per_micro_step, fitted.comm_per_sync, fitted.per_step],
                     dtype=torch.float64)
    assert fitted.per_step == 0.0 and min(x.tolist()) >= 0
    design, ones = _relative_design(KS, window, every)
    gradient = design.T @ (design @ x - ones)  # KKT: 0 where x > 0, >= 0 where x == 0
    assert gradient[:2].abs().max() < 1e-9 and gradient[2] >= -1e-9
    clipped = torch.linalg.lstsq(design, ones[:, None]).solution[:, 0].clamp(min=0)
    assert (design @ x - ones).norm() < (design @ clipped - ones).norm()


def test_ddp_relative_residuals_are_zero_on_the_model_and_signed():
    model = DdpStepModel(0.002, 0.003, 0.001)
    window = [model.step_seconds(k, "window") for k in KS]
    every = [model.step_seconds(k, "every") for k in KS]
    residuals = ddp_relative_residuals(model, KS, window, every)
    assert set(residuals) == {(k, s) for k in KS for s in ("window", "every")}
    assert max(abs(r) for r in residuals.values()) < 1e-12
    slow = ddp_relative_residuals(model, KS, [2 * w for w in window], every)
    assert slow[1, "window"] == pytest.approx(-0.5) and slow[1, "every"] == pytest.approx(0)
    with pytest.raises(ValueError, match=r"window_seconds\[0\] must be > 0; got 0"):
        fit_ddp_step_model(KS, [0, *window[1:]], every)
    with pytest.raises(TypeError, match="model must be a DdpStepModel"):
        ddp_relative_residuals(None, KS, window, every)


def test_the_ddp_step_figure_is_one_panel_of_the_accumulation_plan_figure():
    from gradaccum_course.plots import plot_accumulation_plan, plot_ddp_step
    from gradaccum_lib.measure.planning import StepTimeModel, plan_accumulation

    plan = plan_accumulation(num_parameters=10, activation_bytes_per_sample=1.0,
                             step_time=StepTimeModel(0.001, 0.0001), micro_batch_size=2,
                             accumulation_steps=2)
    width, height = plot_accumulation_plan(plan, plan).get_size_inches()
    assert tuple(plot_ddp_step(DdpStepModel(0.001, 0.002), 8).get_size_inches()) == (
        width / 2, height)


@pytest.mark.parametrize("module", [
    "measure.bench", "measure.comm", "measure.memory", "measure.metrics", "measure.noise",
    "measure.planning", "workloads.data", "workloads.models",
])
def test_a_wing_module_exports_only_what_it_defines(module):
    # one import path per name: planning once re-exported cluster's planners, and data the
    # corpus's LABELS
    import ast
    import importlib

    imported = importlib.import_module(f"gradaccum_lib.{module}")
    with open(imported.__file__, encoding="utf-8") as source:
        tree = ast.parse(source.read())
    defined = {node.name for node in tree.body
               if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    defined |= {target.id for node in tree.body if isinstance(node, ast.Assign)
                for target in node.targets if isinstance(target, ast.Name)}
    defined |= {node.target.id for node in tree.body if isinstance(node, ast.AnnAssign)}
    assert sorted(set(imported.__all__) - defined) == []
    assert len(imported.__all__) == len(set(imported.__all__))
