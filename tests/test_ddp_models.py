"""The DDP step-time model, torchrun command lines, the FSDP2 probe and the time widget."""

from __future__ import annotations

import pytest

from gradaccum_course.launch import launch, torchrun_command
from gradaccum_course.plots import plot_ddp_step
from gradaccum_course.widgets import _describe_ddp_step, ddp_time_explorer
from gradaccum_lib.measure.planning import DdpStepModel, fit_ddp_step_model


def test_ddp_step_model_times_and_shares():
    model = DdpStepModel(compute_per_micro_step=1.0, comm_per_sync=1.5, per_step=0.5)
    assert model.step_seconds(4, "window") == 4 + 1.5 + 0.5
    assert model.step_seconds(4, "every") == 4 + 6 + 0.5
    assert model.comm_fraction(4) == pytest.approx(1.5 / 6.0)
    with pytest.raises(ValueError, match="sync must be 'window' or 'every'"):
        model.step_seconds(4, "never")
    with pytest.raises(ValueError, match="accumulation_steps must be a positive int; got 0"):
        model.step_seconds(0)
    share = DdpStepModel.from_comm_share(2.0, 0.6)
    assert share.comm_fraction(1) == pytest.approx(0.6)
    with pytest.raises(ValueError, match=r"comm_share must be in \[0, 1\)"):
        DdpStepModel.from_comm_share(1.0, 1.0)
    with pytest.raises(ValueError, match="compute_per_micro_step must be > 0; got 0.0"):
        DdpStepModel.from_comm_share(0.0, 0.6)


def test_fit_ddp_step_model_recovers_known_terms():
    truth = DdpStepModel(0.002, 0.003, 0.001)
    ks = [1, 2, 4, 8]
    fitted = fit_ddp_step_model(ks, [truth.step_seconds(k, "window") for k in ks],
                                [truth.step_seconds(k, "every") for k in ks])
    assert fitted.compute_per_micro_step == pytest.approx(0.002)
    assert fitted.comm_per_sync == pytest.approx(0.003)
    assert fitted.per_step == pytest.approx(0.001)
    with pytest.raises(ValueError, match="at least two k values"):
        fit_ddp_step_model([1], [1.0], [1.0])
    with pytest.raises(ValueError, match="must differ"):
        fit_ddp_step_model([1, 1], [1.0, 1.0], [1.0, 1.0])


def test_torchrun_command_single_and_multi_node():
    assert torchrun_command("m", ["--x", "1"], nproc_per_node=2) == (
        "torchrun --standalone --nproc_per_node=2 -m m --x 1")
    assert torchrun_command("scripts/x.py", [], nproc_per_node=2) == (
        "torchrun --standalone --nproc_per_node=2 scripts/x.py")
    multi = torchrun_command("m", [], nproc_per_node=8, nnodes=2, rdzv_endpoint="h:29400")
    assert "--nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=h:29400" in multi
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        torchrun_command("m", [], nproc_per_node=8, nnodes=2)
    with pytest.raises(ValueError, match="must be >= 1"):
        torchrun_command("m", [], nproc_per_node=0)


def test_fsdp2_without_sync_holds_the_unsharded_gradient():
    probe = launch("gradaccum_course.programs.memory_probe", [], nproc_per_node=2,
                   timeout_seconds=180)
    assert probe["no_sync"] == {"unsharded": probe["parameter_bytes"], "sharded": 0}
    assert probe["sync"] == {"unsharded": 0, "sharded": probe["parameter_bytes"] // 2}


def test_ddp_time_explorer_redraws():
    explorer = ddp_time_explorer(0.001, comm_share=0.6, accumulation_steps=8)
    steps, share, summary, image = explorer.children
    model = DdpStepModel.from_comm_share(0.001, 0.6)
    assert summary.value == _describe_ddp_step(model, 8)
    first = bytes(image.value)
    share.value = 0.2
    assert summary.value == _describe_ddp_step(DdpStepModel.from_comm_share(0.001, 0.2), 8)
    assert bytes(image.value) != first
    assert len(plot_ddp_step(model, 4).axes[0].patches) == 4
