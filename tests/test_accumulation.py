"""accumulate_window (gradaccum_lib/accumulation.py): equal to large-batch training (float64)
for uneven micro-batches, token losses and a partial last window; clipping, the scheduler and
GradScaler once a window; bf16 autocast; a non-finite loss, a bad count or no items raise with
no step taken; DDP (uneven ranks, a user's comm hook) and FSDP2 equal to the ground truth."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gradaccum_lib import NonFiniteLossError, split_into_micro_batches
from gradaccum_lib.accumulation import WindowResult, accumulate_window
from gradaccum_lib.batches import NonFiniteGradientError, windows_of
from gradaccum_lib.losses import sample_classification_loss, token_classification_loss
from gradaccum_lib.workloads.data import make_toy_classification, make_toy_token_batch
from gradaccum_lib.workloads.models import TokenTagger, make_mlp

DATA = make_toy_classification(100, 8, 3, seed=4)  # 100 = 3 windows of 32 + a partial 4
WORKER = Path(__file__).resolve().parent / "workers" / "fsdp_window.py"


def _setup(*, dtype=torch.float64, max_grad_norm=0.5):
    model = make_mlp(8, 16, 3, seed=0, dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, {"scheduler": scheduler, "max_grad_norm": max_grad_norm}


def _windows(split: str | int, data=DATA) -> list[list]:
    """Windows of 32 samples (the last one 4): ``"large"`` one micro-batch each, an int k that
    many micro-batches of 32 / k, ``"uneven"`` three micro-batches of 11, 11 and 10."""
    chunks = split_into_micro_batches(data, micro_batch_size=32)
    if split == "large":
        return [[chunk] for chunk in chunks]
    if split == "uneven":
        return [split_into_micro_batches(chunk, accumulation_steps=min(3, len(chunk[1])))
                for chunk in chunks]
    return list(windows_of(split_into_micro_batches(data, micro_batch_size=32 // split), split))


def _train(windows, epochs=3, **options):
    model, optimizer, defaults = _setup(**{k: options.pop(k) for k in ("dtype",) if k in options})
    results = [accumulate_window(model, optimizer, window, sample_classification_loss,
                                 **(defaults | options))
               for _ in range(epochs) for window in windows]
    return model, results, defaults["scheduler"]


def _max_parameter_difference(a, b):
    return max((x - y).abs().max().item()
               for x, y in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize("split", [4, 8, 2, "uneven"])
def test_accumulation_equals_large_batch_training_with_partial_windows(split):
    large, large_results, _ = _train(_windows("large"))
    accumulated, results, scheduler = _train(_windows(split))
    assert _max_parameter_difference(large, accumulated) <= 1e-12
    assert [r.items for r in results] == [32.0, 32.0, 32.0, 4.0] * 3
    for name in ("loss", "grad_norm"):
        assert [getattr(r, name) for r in results] == pytest.approx(
            [getattr(r, name) for r in large_results], rel=1e-12)
    assert all(r.stepped for r in results) and scheduler.last_epoch == 12


def test_window_loss_is_item_weighted_and_the_gradient_is_clipped_once_after_accumulating():
    model, optimizer, options = _setup()
    inputs, labels = DATA[0][:32], DATA[1][:32]
    expected_loss = torch.nn.functional.cross_entropy(model(inputs), labels)
    expected_loss.backward()
    expected_norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    result = accumulate_window(model, optimizer, _windows(4)[0], sample_classification_loss,
                               **options)
    assert isinstance(result, WindowResult) and result.stepped and result.items == 32.0
    assert result.loss == pytest.approx(expected_loss.item(), rel=1e-12)
    assert result.grad_norm == pytest.approx(expected_norm.item(), rel=1e-12)
    assert result.grad_norm > 0.5  # so clipping was active: on the window's gradient, once
    clipped = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
    # clip_grad_norm_'s factor, max_norm / (norm + 1e-6), applied to the window's gradient
    assert clipped == pytest.approx(0.5 * result.grad_norm / (result.grad_norm + 1e-6),
                                    rel=1e-12)


def test_token_windows_with_uneven_counts_equal_the_large_batch():
    batch = make_toy_token_batch(24, 16, 30, 4, sort_by_length=True, seed=1)
    models = []
    for micro_batch_size, k in ((12, 1), (3, 4)):
        model = TokenTagger(30, 8, 4, seed=2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(3):
            for window in windows_of(split_into_micro_batches(
                    batch, micro_batch_size=micro_batch_size), k):
                accumulate_window(model, optimizer, window, token_classification_loss)
        models.append(model)
    assert _max_parameter_difference(*models) <= 1e-12


def test_stale_gradients_do_not_leak_in_and_each_backward_adds_to_the_running_sum():
    clean, _, _ = _train([_windows("uneven")[0], *_windows(4)[1:]], epochs=1)
    model, optimizer, options = _setup()
    for parameter in model.parameters():
        parameter.grad = torch.ones_like(parameter)
    seen = []  # the bias's .grad each time the loop asks for a loss: after the previous backward

    def loss_fn(model, micro_batch):
        grad = model[0].bias.grad
        seen.append(None if grad is None else grad.clone())
        return sample_classification_loss(model, micro_batch)

    window = _windows("uneven")[0]  # 11, 11, 10 items
    accumulate_window(model, optimizer, window, loss_fn, **options)
    assert seen[0] is None  # zeroed (set to None): the stale ones never reach the sum
    reference = make_mlp(8, 16, 3, seed=0, dtype=torch.float64)
    for micro_batch, grad in zip(window[:-1], seen[1:], strict=True):
        sample_classification_loss(reference, micro_batch)[0].backward()  # summed, no divide
        assert torch.allclose(grad, reference[0].bias.grad, rtol=1e-12, atol=0)
    for window in _windows(4)[1:]:
        accumulate_window(model, optimizer, window, sample_classification_loss, **options)
    assert _max_parameter_difference(clean, model) == 0.0


def test_the_parameters_stepped_follow_the_optimizer_groups():
    model = make_mlp(8, 16, 3, seed=0, dtype=torch.float64)
    optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)
    window = _windows("uneven")[0]
    accumulate_window(model, optimizer, window, sample_classification_loss)
    optimizer.add_param_group({"params": list(model[2].parameters())})
    before = model[2].weight.detach().clone()
    result = accumulate_window(model, optimizer, window, sample_classification_loss)
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert result.grad_norm == pytest.approx(grads.norm().item(), rel=1e-12)
    assert not torch.equal(model[2].weight, before)


def test_bf16_autocast_on_cpu_trains_close_to_fp32():
    fp32, fp32_results, _ = _train(_windows(4, (DATA[0].float(), DATA[1])), epochs=2,
                                   dtype=torch.float32)
    bf16, bf16_results, _ = _train(_windows(4, (DATA[0].float(), DATA[1])), epochs=2,
                                   dtype=torch.float32, autocast_dtype=torch.bfloat16)
    losses = [r.loss for r in bf16_results]
    assert all(math.isfinite(loss) for loss in losses)
    assert losses == pytest.approx([r.loss for r in fp32_results], rel=0.05)
    assert 0 < _max_parameter_difference(fp32, bf16) < 0.05


def test_grad_scaler_steps_like_no_scaler_and_a_skipped_step_leaves_the_scheduler():
    """GradScaler on a CPU (torch >= 2.3): a scale of 2**10 gives the unscaled run's steps; a
    scale of 2**127 overflows, so the first windows skip, and the scheduler counts only the
    steps taken."""
    data = (DATA[0].float(), DATA[1])
    plain, plain_results, _ = _train(_windows(4, data), epochs=1, dtype=torch.float32)
    scaled, scaled_results, _ = _train(_windows(4, data), epochs=1, dtype=torch.float32,
                                       scaler=torch.amp.GradScaler("cpu", init_scale=2.0**10))
    assert all(r.stepped for r in scaled_results)
    assert _max_parameter_difference(plain, scaled) < 1e-5
    model, optimizer, options = _setup(dtype=torch.float32)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)
    before = [p.detach().clone() for p in model.parameters()]
    first = accumulate_window(model, optimizer, _windows(4, data)[0],
                              sample_classification_loss, scaler=scaler, **options)
    assert not first.stepped and not math.isfinite(first.grad_norm)
    assert options["scheduler"].last_epoch == 0 and scaler.get_scale() == 2.0**126
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    results = [accumulate_window(model, optimizer, window, sample_classification_loss,
                                 scaler=scaler, **options) for window in _windows(4, data) * 30]
    taken = sum(r.stepped for r in results)
    assert 0 < taken < len(results) and options["scheduler"].last_epoch == taken


def test_fp16_autocast_with_a_scaler_started_at_2_16_over_the_items_skips_no_step():
    """The module's advice: summed losses are ``items`` times mean ones, so a GradScaler
    started at 2**16 / items_per_window (32 here) skips no step where the default 2**16 skips
    its first; fp16 autocast on a CPU then trains close to fp32."""
    data = (DATA[0].float(), DATA[1])
    fp32, fp32_results, _ = _train(_windows(4, data), epochs=2, dtype=torch.float32)
    fp16, fp16_results, _ = _train(
        _windows(4, data), epochs=2, dtype=torch.float32, autocast_dtype=torch.float16,
        scaler=torch.amp.GradScaler("cpu", init_scale=2.0**16 / 32))
    assert all(r.stepped for r in fp16_results)
    _, default_results, _ = _train(  # GradScaler's default 2**16 overflows the summed loss
        _windows(4, data), epochs=2, dtype=torch.float32, autocast_dtype=torch.float16,
        scaler=torch.amp.GradScaler("cpu"))
    assert not default_results[0].stepped and default_results[-1].stepped
    assert [r.loss for r in fp16_results] == pytest.approx([r.loss for r in fp32_results],
                                                           rel=0.05)
    assert 0 < _max_parameter_difference(fp32, fp16) < 0.05


def test_non_finite_loss_names_the_micro_step_takes_no_step_and_clears_the_grads():
    model, optimizer, options = _setup()
    window = _windows(4)[0]
    before = [p.detach().clone() for p in model.parameters()]

    def poisoned(model, batch):
        summed, count = sample_classification_loss(model, batch)
        return (summed * float("inf") if batch[0] is window[2][0] else summed), count

    with pytest.raises(NonFiniteLossError, match="micro-batch 2 produced a non-finite") as info:
        accumulate_window(model, optimizer, window, poisoned, **options)
    assert info.value.micro_step == 2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())
    assert options["scheduler"].last_epoch == 0 and optimizer.state == {}


def test_a_half_model_whose_accumulated_gradient_overflows_raises_and_takes_no_step():
    """A .half() model, no GradScaler: the summed gradient of 3,001 items (300,100) is past
    float16's 65,504; an error naming the parameter, no step, the gradients cleared."""
    model = torch.nn.Linear(1, 1, bias=False).half()
    torch.nn.init.constant_(model.weight, 0.01)

    def loss_fn(model, inputs):
        return (model(inputs) * 100).sum(), inputs.shape[0]

    inputs = torch.ones(3001, 1, dtype=torch.float16)
    with pytest.raises(NonFiniteGradientError, match=r"not finite \(first at parameter 'weight'"):
        accumulate_window(model, torch.optim.SGD(model.parameters(), lr=0.1),
                          [inputs[:1], inputs[1:]], loss_fn)
    assert model.weight.item() == pytest.approx(0.01, rel=1e-3)  # float16's 0.01, untouched
    assert model.weight.grad is None


@pytest.mark.parametrize(("count", "message"), [
    (-1, r"num_items must be finite and >= 0; got -1\.0 at micro-batch 1"),
    (torch.tensor(float("nan")), r"num_items must be finite and >= 0; got nan at micro-batch 1"),
    (torch.tensor(float("inf")), r"got inf at micro-batch 1"),
])
def test_a_bad_count_raises_naming_the_micro_batch_and_takes_no_step(count, message):
    model, optimizer, options = _setup()
    before = [p.detach().clone() for p in model.parameters()]

    def loss_fn(model, batch):
        summed, items = sample_classification_loss(model, batch)
        return summed, count if batch[0] is window[1][0] else items

    window = _windows(4)[0]
    with pytest.raises(ValueError, match=message):
        accumulate_window(model, optimizer, window, loss_fn, **options)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())


def test_counts_that_overflow_when_added_are_named_as_such_and_take_no_step():
    model, optimizer, options = _setup()

    def loss_fn(model, batch):
        return sample_classification_loss(model, batch)[0], 1e308  # each finite; two: inf

    with pytest.raises(ValueError, match=r"item count overflowed to inf: loss_fn's num_items "
                                         r"are finite but too large to add up"):
        accumulate_window(model, optimizer, _windows(4)[0], loss_fn, **options)
    assert all(p.grad is None for p in model.parameters())


def test_fsdp2s_sync_setting_is_restored_when_loss_fn_raises_mid_window():
    """FSDP2's sync flag is a setting, not a context: a loss_fn that raises on a no-sync
    micro-step must not leave the module skipping its reduce-scatter for the next caller."""
    from gradaccum_lib.accumulation import _gradient_sync

    class Sharded(torch.nn.Linear):  # what the loop reads of an FSDP2 module: the setter
        syncs = True

        def set_requires_gradient_sync(self, sync: bool) -> None:
            self.syncs = sync

    model = Sharded(2, 2)
    with pytest.raises(RuntimeError, match="loss_fn failed"):
        with _gradient_sync(model, False):
            assert model.syncs is False
            raise RuntimeError("loss_fn failed")
    assert model.syncs is True


def test_a_window_without_items_raises_and_takes_no_step():
    model, optimizer, options = _setup()
    with pytest.raises(ValueError, match=r"window covers no items \(every num_items was 0"):
        accumulate_window(model, optimizer, _windows(4)[0],
                          lambda m, b: (sample_classification_loss(m, b)[0], 0), **options)
    assert all(p.grad is None for p in model.parameters()) and optimizer.state == {}


def test_every_rank_raises_and_ddp_and_fsdp2_equal_the_ground_truth():
    """One torchrun of 2 gloo ranks (tests/workers/fsdp_window.py): rank 0 holds 12 samples a
    window, rank 1 20; three windows of 2 micro-batches each, then a partial one."""
    from gradaccum_course.launch import launch

    result = launch(str(WORKER), [], nproc_per_node=2, timeout_seconds=240)
    reference = result["reference"]
    for how in ("ddp", "ddp, sync every micro-step", "ddp, counting hook", "ddp, PowerSGD",
                "ddp, bucket view", "fsdp2", "fsdp2, sync every micro-step"):
        run = result[how]
        assert run["items"] == [32.0, 32.0, 32.0, 7.0], how  # the global count, not 2 x 12
        assert max(abs(a - b) for a, b in zip(run["parameters"], reference, strict=True)) \
            <= 1e-12, how
        assert run["losses"] == pytest.approx(result["reference_losses"], rel=1e-12), how
    # the user's hook stays in place and syncs once a window: on its last micro-step only
    hooked = result["ddp, counting hook"]
    assert hooked["hook_syncs_per_window"] == [1, 1, 1, 1]
    assert hooked["slot_after"].startswith("taken")
    assert result["ddp"]["slot_after"] == "free"  # the loop registered no hook of its own
    # the loop's own collective: one small all_reduce a window (the totals, during the last
    # backward); DDP's C++ hook is not seen; the user's hook is
    assert result["ddp"]["all_reduces_per_window"] == [1, 1, 1, 1]
    assert hooked["all_reduces_per_window"] == [2, 2, 2, 2]
    # a NaN on rank 1 only: both ranks raise (rank 1 names its micro-batch), no step anywhere
    for kind in ("ddp", "fsdp2"):
        nan = result[f"nan, {kind}"]
        assert nan["raised"][0].startswith("NonFiniteLossError: a micro-batch on another rank"), nan
        assert "micro-batch 1 produced a non-finite loss" in nan["raised"][1], nan
        assert nan["stepped"] == [False, False], nan
    # a count of -1 on rank 1: rank 1 names its micro-batch, rank 0 says another rank's count
    count = result["count, ddp"]
    assert count["raised"] == [
        "ValueError: loss_fn's num_items must be finite and >= 0; a micro-batch on another rank "
        "returned an invalid one",
        "ValueError: loss_fn's num_items must be finite and >= 0; got -1.0 at micro-batch 1"]
    assert count["stepped"] == [False, False]
    # agree_on_windows, once per epoch: rank 1's data ran out (2 | 0), or it stops calling a
    # window early, or FSDP2 at 3 | 2 micro-batches: every rank raises the same error, naming
    # rank 1, within 10 s; DDP at 3 | 2 is exact
    for kind in ("ddp", "fsdp2"):
        for name, says in (("empty", "rank 1 holds an empty window (window 0, micro-batches "
                                     "per rank: [2, 0])"),
                           ("stops", "rank 1 holds fewer windows this epoch (windows per rank: "
                                     "[2, 1])")):
            case = result[f"{name}, {kind}"]
            assert case["raised"][0] == case["raised"][1], case
            assert case["raised"][0].startswith(f"ValueError: {says}"), case
            assert max(case["seconds"]) < 10, case
    uneven = result["3 | 2, fsdp2"]
    assert uneven["raised"] == ["ValueError: window 0 holds [3, 2] micro-batches per rank under "
                                "FSDP2" + uneven["raised"][0].split("FSDP2", 1)[1]] * 2, uneven
    assert result["3 | 2, ddp"]["raised"] == ["no error", "no error"]
    assert result["3 | 2, ddp, gradient error"] <= 1e-12


class _CountOps(TorchDispatchMode):
    """Counts the tensor operations dispatched inside it (reading a number out of a CPU
    tensor, ``_local_scalar_dense``, is no kernel: left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.count += func is not torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def _extra_ops_per_window(k: int) -> int:
    """Tensor operations of one window of accumulate_window minus the bare nanoGPT loop's, on
    the same model, data and AdamW (a window first, so that the optimizer's state exists)."""
    from gradaccum_course.audits.frameworks import bare_loop

    window = split_into_micro_batches(make_toy_classification(16, 8, 2, dtype=torch.float32),
                                      accumulation_steps=k)
    counts = []
    for loop in ("library", "bare"):
        model = make_mlp(8, 8, 2, dtype=torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        step = (functools.partial(accumulate_window, model, optimizer, window,
                                  sample_classification_loss) if loop == "library"
                else functools.partial(bare_loop(model, optimizer, k, lambda m, b: (
                    sample_classification_loss(m, b)[0] / len(b[1]))), window))
        step()
        with _CountOps() as counter:
            step()
        counts.append(counter.count)
    return counts[0] - counts[1]


def test_the_loops_cost_beyond_the_bare_loop_is_once_a_window():
    """Counts, not timings: what the loop adds to nanoGPT's (the count, its checks, the
    rescale, the norm) is paid once a window, so it does not grow with k (the bare loop's
    division per micro-step even makes it shrink)."""
    once = _extra_ops_per_window(1)
    assert 0 < once < 30
    assert all(_extra_ops_per_window(k) <= once for k in (4, 16))
