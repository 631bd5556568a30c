"""A torchrun worker for tests/test_launch.py, run through ``run_worker``.

Each rank writes its pid to ``READY_DIR/rank-R`` once running (after ``run_worker`` has set up
its parent-death signal and stack dumps), then the ranks in ``--hang-ranks`` sleep for an
hour and those in ``--fail-ranks`` raise, while the others finish. ``--process-group``
joins a gloo process group first; ``--release FILE`` makes every rank wait for FILE to exist
before finishing.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch.distributed as dist

from gradaccum_course.launch import run_worker
from gradaccum_lib.distributed import init_distributed


def main() -> int:
    """Write the ready file, hang or finish; rank 0 writes ``{"world_size": N}`` as JSON."""
    parser = argparse.ArgumentParser(prog="hang.py")
    parser.add_argument("--ready-dir", required=True)
    parser.add_argument("--hang-ranks", default="", help="comma-separated ranks that hang")
    parser.add_argument("--fail-ranks", default="", help="comma-separated ranks that raise")
    parser.add_argument("--process-group", action="store_true")
    parser.add_argument("--release", default=None)
    parser.add_argument("--json", required=True)
    arguments = parser.parse_args()
    context = init_distributed(30.0) if arguments.process_group else None
    rank = int(os.environ["RANK"])
    (Path(arguments.ready_dir) / f"rank-{rank}").write_text(str(os.getpid()))
    if str(rank) in arguments.hang_ranks.split(","):
        time.sleep(3600)
    if str(rank) in arguments.fail_ranks.split(","):
        raise RuntimeError(f"deliberate failure on rank {rank}")
    while arguments.release is not None and not Path(arguments.release).exists():
        time.sleep(0.05)
    if rank == 0:
        Path(arguments.json).write_text(json.dumps({"world_size": os.environ["WORLD_SIZE"]}))
    if context is not None:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    run_worker(main)
