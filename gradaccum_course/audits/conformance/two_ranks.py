"""The conformance table's 2-rank scenario: each framework's accumulation path on 2 gloo
ranks (torchrun, through :func:`gradaccum_course.launch.launch`), k = 2 micro-batches per rank,
so that the window is the same 8 uneven sequences as the one-process scenarios' and the truth
is their full batch. Each rank runs :func:`~gradaccum_lib.equivalence.audit_update` (the truth
in-process on the whole window, the framework's step on its own shard of it, as the framework
shards a DataLoader); rank 0 writes the result, with each rank's logged loss where the
framework logs one (the Trainer's step ``loss``, Lightning's epoch ``train_loss``).
Run: ``torchrun --nproc_per_node=2 -m gradaccum_course.audits.conformance.two_ranks
--framework NAME --json PATH``.
"""

from __future__ import annotations

import json
import os
import sys
from importlib.metadata import version
from pathlib import Path

import torch.distributed as dist

from gradaccum_course.launch import launch, run_worker
from gradaccum_lib.distributed import init_distributed
from gradaccum_lib.equivalence import audit_update

from .scenarios import Scenario, make_optimizer, token_loss, window_mean_loss

__all__ = ["PACKAGES", "run"]

PACKAGES = {"trainer": "transformers", "accelerate": "accelerate", "lightning": "lightning",
            "trl": "trl"}


def _step(framework: str, accumulation_steps: int, logged: dict[str, float]):  # noqa: ANN202
    if framework == "trainer":
        from .trainer import logging_step

        return logging_step(accumulation_steps, logged)
    if framework == "trl":
        from .trl import sft_step

        return sft_step(accumulation_steps, 0.0, logged)
    if framework == "accelerate":
        from ..frameworks import accelerate_step

        return accelerate_step(accumulation_steps)
    from .lightning import fit_step

    return fit_step(accumulation_steps, 0.0, logged, devices=dist.get_world_size())


def _main() -> int:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # 2 gloo ranks on the CPU, on any machine
    framework, json_path = sys.argv[sys.argv.index("--framework") + 1], sys.argv[-1]
    context = init_distributed(timeout_seconds=120)
    from .scenarios import SCENARIOS

    (scenario,) = [s for s in SCENARIOS if s.key == "two_ranks"]
    logged: dict[str, float] = {}  # Lightning's epoch train_loss, as this rank logs it
    audit = audit_update(_step(framework, scenario.accumulation_steps, logged),
                         scenario.model(), token_loss, scenario.micro_batches(), make_optimizer)
    gathered = [None] * context.world_size
    dist.all_gather_object(gathered, audit.relative_difference)
    ranks_logged = [None] * context.world_size
    dist.all_gather_object(ranks_logged, logged.get("train_loss"))
    if context.is_main:
        Path(json_path).write_text(json.dumps({
            "gradient_relative_error": audit.relative_difference,
            "norm_ratio": audit.norm_ratio, "ranks_relative_error": gathered,
            "ranks_logged_loss": ranks_logged,
            "true_loss": window_mean_loss(scenario.model(), scenario.micro_batches()),
            "version": version(PACKAGES[framework])}))
    dist.barrier()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def run(framework: str, scenario: Scenario) -> dict[str, float | None | str]:
    """Return ``framework``'s cell for the 2-rank ``scenario``: its logged loss is the one
    rank 0 logs (what a logger there records); Accelerate logs none."""
    del scenario  # the workers build it themselves, by key
    result = launch("gradaccum_course.audits.conformance.two_ranks", ["--framework", framework],
                    nproc_per_node=2, timeout_seconds=300)
    if max(result["ranks_relative_error"]) - min(result["ranks_relative_error"]) > 1e-9:
        raise RuntimeError(f"{framework}: the 2 ranks ended with different updates: {result}")
    if result["ranks_logged_loss"][0] is not None:  # what a logger on rank 0 records
        return {**result, "logged_loss": result["ranks_logged_loss"][0]}
    from .accelerate import NO_LOGGED_LOSS

    return {**result, "logged_loss": None, "true_loss": None, "logged_not_run": NO_LOGGED_LOSS}


if __name__ == "__main__":
    run_worker(_main)
