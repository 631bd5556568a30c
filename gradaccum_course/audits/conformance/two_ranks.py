"""The conformance table's 2-rank scenario: each framework's accumulation path on 2 gloo
ranks (torchrun, through :func:`gradaccum_course.launch.launch`), k = 2 micro-batches per rank,
so that the window is the same 8 uneven sequences as the one-process scenarios' and the truth
is their full batch. Each rank runs :func:`~gradaccum_lib.equivalence.audit_update` (the truth
in-process on the whole window, the framework's step on its own shard of it, as the framework
shards a DataLoader); rank 0 writes the result.
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

from .scenarios import Scenario, make_optimizer, token_loss

__all__ = ["PACKAGES", "run"]

PACKAGES = {"trainer": "transformers", "accelerate": "accelerate", "lightning": "lightning"}


def _step(framework: str, accumulation_steps: int):  # noqa: ANN202
    if framework == "trainer":
        from ..hf_trainer import hf_trainer_step

        return hf_trainer_step(accumulation_steps, shuffle=False)
    if framework == "accelerate":
        from ..frameworks import accelerate_step

        return accelerate_step(accumulation_steps)
    from .lightning import fit_step

    return fit_step(accumulation_steps, 0.0, {}, devices=dist.get_world_size())


def _main() -> int:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # 2 gloo ranks on the CPU, on any machine
    framework, json_path = sys.argv[sys.argv.index("--framework") + 1], sys.argv[-1]
    context = init_distributed(timeout_seconds=120)
    from .scenarios import SCENARIOS

    (scenario,) = [s for s in SCENARIOS if s.key == "two_ranks"]
    audit = audit_update(_step(framework, scenario.accumulation_steps), scenario.model(),
                         token_loss, scenario.micro_batches(), make_optimizer)
    gathered = [None] * context.world_size
    dist.all_gather_object(gathered, audit.relative_difference)
    if context.is_main:
        Path(json_path).write_text(json.dumps({
            "gradient_relative_error": audit.relative_difference,
            "norm_ratio": audit.norm_ratio, "ranks_relative_error": gathered,
            "version": version(PACKAGES[framework])}))
    dist.barrier()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def run(framework: str, scenario: Scenario) -> dict[str, float | None | str]:
    """Return ``framework``'s cell for the 2-rank ``scenario`` (its logged loss not run)."""
    del scenario  # the workers build it themselves, by key
    result = launch("gradaccum_course.audits.conformance.two_ranks", ["--framework", framework],
                    nproc_per_node=2, timeout_seconds=300)
    if max(result["ranks_relative_error"]) - min(result["ranks_relative_error"]) > 1e-9:
        raise RuntimeError(f"{framework}: the 2 ranks ended with different updates: {result}")
    return {**result, "logged_loss": None, "true_loss": None,
            "logged_not_run": "the logged loss on 2 ranks is left for a later session"}


if __name__ == "__main__":
    run_worker(_main)
