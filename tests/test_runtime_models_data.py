"""runtime (profiles, devices, seeds), toy models, toy data and the loss functions."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from gradaccum_lib.losses import cross_entropy_sum, info_nce_loss
from gradaccum_lib.runtime import (
    _PROFILES,
    choose_device,
    get_profile,
    make_deterministic,
    make_generator,
    set_seed,
)
from gradaccum_lib.workloads.data import (
    _PAD_ID,
    IGNORE_INDEX,
    make_toy_classification,
    make_toy_token_batch,
)
from gradaccum_lib.workloads.models import TokenTagger, make_mlp


def test_profile_from_argument_environment_and_default(monkeypatch):
    assert get_profile("gpu").name == "gpu"
    monkeypatch.setenv("GRADACCUM_PROFILE", "ci")
    assert get_profile() is _PROFILES["ci"]
    monkeypatch.delenv("GRADACCUM_PROFILE")
    expected = "gpu" if torch.cuda.is_available() else "cpu"
    assert get_profile().name == expected
    monkeypatch.setenv("GRADACCUM_PROFILE", "huge")
    with pytest.raises(ValueError, match=r"profile must be one of \['ci', 'cpu', 'gpu'\].*'huge'"):
        get_profile()


def test_profiles_grow_from_ci_to_gpu():
    ci, cpu, gpu = _PROFILES["ci"], _PROFILES["cpu"], _PROFILES["gpu"]
    assert ci.num_samples < cpu.num_samples < gpu.num_samples


def test_choose_device_prefers_cuda_then_mps_then_cpu(monkeypatch):
    assert choose_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert choose_device() == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert choose_device() == torch.device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert choose_device() == torch.device("cpu")


def test_set_seed_makes_every_generator_repeat():
    set_seed(3)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    set_seed(3)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first
    with pytest.raises(ValueError, match="seed must be a non-negative int; got -1"):
        set_seed(-1)


def test_make_generator_is_private_and_repeatable():
    state = torch.get_rng_state()
    a = torch.rand(3, generator=make_generator(5))
    assert torch.equal(a, torch.rand(3, generator=make_generator(5)))
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(ValueError, match="seed must be"):
        make_generator(1.5)


def test_make_deterministic_sets_threads_and_rejects_bad_counts():
    threads = torch.get_num_threads()
    try:
        make_deterministic(threads=1)
        assert torch.get_num_threads() == 1
        assert torch.are_deterministic_algorithms_enabled()
        with pytest.raises(ValueError, match="threads must be a positive int or None; got 0"):
            make_deterministic(threads=0)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(threads)


def test_make_mlp_is_seeded_and_validates():
    a, b = make_mlp(3, 4, 2, seed=1), make_mlp(3, 4, 2, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert a[0].weight.dtype == torch.float64
    kinds = [type(m).__name__ for m in make_mlp(3, 4, 2, normalization="layer", dropout=0.1)]
    assert kinds == ["Linear", "LayerNorm", "Tanh", "Dropout", "Linear"]
    with pytest.raises(ValueError, match="hidden_dim must be a positive int; got 0"):
        make_mlp(3, 0, 2)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\); got 1.0"):
        make_mlp(3, 4, 2, dropout=1.0)
    with pytest.raises(ValueError, match="normalization must be one of"):
        make_mlp(3, 4, 2, normalization="group")


def test_token_tagger_shapes_and_padding_embedding():
    tagger = TokenTagger(10, 4, 3, seed=0)
    logits = tagger(torch.tensor([[1, 2, 0]]))
    assert logits.shape == (1, 3, 3)
    assert torch.equal(tagger.embedding.weight[_PAD_ID], torch.zeros(4, dtype=torch.float64))


def test_toy_classification_is_deterministic_and_uses_every_class():
    x1, y1 = make_toy_classification(200, 4, 3, seed=9)
    x2, y2 = make_toy_classification(200, 4, 3, seed=9)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert set(y1.tolist()) == {0, 1, 2}
    with pytest.raises(ValueError, match="num_samples must be a positive int; got 0"):
        make_toy_classification(0, 4, 3)


def test_toy_token_batch_lengths_padding_and_sorting():
    batch = make_toy_token_batch(50, 10, 30, 4, min_length=2, sort_by_length=True, seed=1)
    lengths = batch["attention_mask"].sum(dim=1)
    assert lengths.min() >= 2 and lengths.max() <= 10
    assert torch.equal(lengths, lengths.sort(descending=True).values)
    padding = batch["attention_mask"] == 0
    assert bool((batch["input_ids"][padding] == _PAD_ID).all())
    assert bool((batch["labels"][padding] == IGNORE_INDEX).all())
    assert bool((batch["input_ids"][~padding] != _PAD_ID).all())
    with pytest.raises(ValueError, match=r"min_length must be an int in \[1, max_length=10\]"):
        make_toy_token_batch(5, 10, 30, 4, min_length=11)
    with pytest.raises(ValueError, match="vocab_size must be an int >= 2"):
        make_toy_token_batch(5, 10, 1, 4)


def test_cross_entropy_sum_counts_and_matches_the_mean():
    logits = torch.randn(4, 5, 3, dtype=torch.float64, generator=make_generator(0))
    targets = torch.tensor([[0, 1, 2, -100, -100]] * 4)
    summed, count = cross_entropy_sum(logits, targets)
    assert int(count) == 12
    mean = torch.nn.functional.cross_entropy(logits.reshape(-1, 3), targets.reshape(-1))
    torch.testing.assert_close(summed / count, mean)
    weight = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    summed, total_weight = cross_entropy_sum(logits, targets, weight=weight)
    assert float(total_weight) == 4 * 7.0
    weighted = torch.nn.functional.cross_entropy(
        logits.reshape(-1, 3), targets.reshape(-1), weight=weight
    )
    torch.testing.assert_close(summed / total_weight, weighted)


def test_info_nce_depends_on_the_other_items_in_the_batch():
    encoder = make_mlp(4, 6, 3, seed=0)
    anchors = torch.randn(8, 4, dtype=torch.float64, generator=make_generator(1))
    positives = anchors + 0.1
    whole, count = info_nce_loss(encoder, (anchors, positives))
    halves = [info_nce_loss(encoder, (anchors[i:i + 4], positives[i:i + 4])) for i in (0, 4)]
    assert int(count) == 8
    assert abs(whole.item() - sum(h[0].item() for h in halves)) > 1e-3
    with pytest.raises(ValueError, match="temperature must be > 0; got 0"):
        info_nce_loss(encoder, (anchors, positives), temperature=0)


def test_describe_profile_names_the_profile_and_its_sizes():
    from gradaccum_lib.runtime import describe_profile

    line = describe_profile(get_profile("ci"), "max_length", "bert_layers")
    assert line == ("GRADACCUM_PROFILE=ci (the committed outputs' sizes; ci | cpu | gpu): "
                    "max_length=128, bert_layers=2")
    every = describe_profile(get_profile("gpu"))
    assert every.startswith("GRADACCUM_PROFILE=gpu (sizes for real hardware")
    assert "num_samples=4096" in every and "emr_epochs=20" in every
    with pytest.raises(ValueError, match="no field 'layers'"):
        describe_profile(get_profile("ci"), "layers")
    with pytest.raises(TypeError, match="must be a Profile"):
        describe_profile("ci")
