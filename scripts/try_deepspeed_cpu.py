"""Try DeepSpeed's gradient accumulation on the CPU, against the library's ground truth.

Not part of `make test`, and DeepSpeed is not a dependency of the series: run this in a
throwaway virtual environment that has the same CPU torch (2.13.0) and DeepSpeed, built
without its compiled ops and without build isolation (so that pip cannot fetch another torch):

    python -m venv /tmp/dsvenv
    /tmp/dsvenv/bin/pip install torch==2.13.0        # the CPU build the project uses
    /tmp/dsvenv/bin/pip download --no-deps --no-binary :all: deepspeed -d /tmp/dsdl
    DS_BUILD_OPS=0 /tmp/dsvenv/bin/pip install --no-build-isolation /tmp/dsdl/deepspeed-*.tar.gz
    /tmp/dsvenv/bin/python scripts/try_deepspeed_cpu.py > benchmarks/deepspeed_cpu.txt

It prints the versions, then each measurement, or the exact error where one fails. The loop is
the one DeepSpeed documents: ``engine(x)``, ``engine.backward(loss)``, ``engine.step()`` for
every micro-batch, ``gradient_accumulation_steps=k`` in the config, a torch SGD optimizer and
a per-step scheduler handed to ``deepspeed.initialize``, one process (gloo), float32 (its
gradient all-reduce refuses float64: "attempting to reduce an unsupported grad type").
"""

from __future__ import annotations

import copy
import logging
import os
import platform
import socket
import sys
import traceback
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # the CPU accelerator, without the warning
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from gradaccum_lib import split_into_micro_batches  # noqa: E402
from gradaccum_lib.equivalence import audit_update  # noqa: E402
from gradaccum_lib.losses import sample_classification_loss  # noqa: E402
from gradaccum_lib.workloads.data import make_toy_classification  # noqa: E402
from gradaccum_lib.workloads.models import make_mlp  # noqa: E402

MICRO_BATCH = 8


def sgd(parameters):  # noqa: ANN001, ANN201
    return torch.optim.SGD(parameters, lr=0.1)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _engine(deepspeed, model, make_optimizer, accumulation_steps):  # noqa: ANN001, ANN202
    optimizer = make_optimizer(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    config = {"train_micro_batch_size_per_gpu": MICRO_BATCH,
              "gradient_accumulation_steps": accumulation_steps,
              "steps_per_print": 10**9, "zero_optimization": {"stage": 0}}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                           lr_scheduler=scheduler, config=config)
    return engine, optimizer, scheduler


def _run(engine, micro_batches) -> None:  # noqa: ANN001
    for inputs, labels in micro_batches:
        loss = torch.nn.functional.cross_entropy(engine(inputs), labels)  # the mean loss
        engine.backward(loss)
        engine.step()


def deepspeed_step(deepspeed, accumulation_steps):  # noqa: ANN001, ANN201
    def step(model, micro_batches, make_optimizer) -> None:  # noqa: ANN001
        engine, _, _ = _engine(deepspeed, model, make_optimizer, accumulation_steps)
        _run(engine, micro_batches)

    return step


def _attempt(label: str, function) -> None:  # noqa: ANN001
    try:
        print(f"{label}: {function()}")
    except Exception as error:  # noqa: BLE001 - the exact error is the result
        print(f"{label}: FAILED with {type(error).__module__}.{type(error).__name__}: {error}")
        frame = traceback.extract_tb(error.__traceback__)[-1]
        where = frame.filename.split("site-packages/")[-1]
        print(f"  raised at {where}:{frame.lineno} in {frame.name}: {frame.line}")


def main() -> int:
    print(f"python {platform.python_version()}, torch {torch.__version__}")
    try:
        import deepspeed
    except Exception as error:  # noqa: BLE001
        print(f"import deepspeed: FAILED with {type(error).__name__}: {error}")
        return 1
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    print(f"deepspeed {deepspeed.__version__}, accelerator {accelerator._name},"
          f" communication backend {accelerator.communication_backend_name()}")
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(_free_port()))
    try:
        deepspeed.init_distributed(dist_backend=accelerator.communication_backend_name())
    except Exception as error:  # noqa: BLE001
        print(f"deepspeed.init_distributed: FAILED with {type(error).__name__}: {error}")
        return 1

    inputs, labels = make_toy_classification(80, 6, 3, seed=0)
    inputs = inputs.float()
    model = make_mlp(6, 16, 3, seed=1, dtype=torch.float32)
    full = split_into_micro_batches((inputs[:32], labels[:32]), micro_batch_size=MICRO_BATCH)
    equal = full[:2]
    uneven = split_into_micro_batches((inputs[:12], labels[:12]), micro_batch_size=MICRO_BATCH)

    def audit(micro_batches, accumulation_steps=4) -> str:  # noqa: ANN001
        result = audit_update(deepspeed_step(deepspeed, accumulation_steps), model,
                              sample_classification_loss, micro_batches, sgd)
        return (f"norm ratio {result.norm_ratio:.3f}, cosine {result.cosine:.3f},"
                f" relative difference {result.relative_difference:.1e}")

    print(f"SGD lr 0.1, micro-batches of {MICRO_BATCH}, gradient_accumulation_steps 4;"
          " one window's update against the full-batch step"
          " (gradaccum_lib.equivalence.audit_update):")
    _attempt("full window (4 x 8)", lambda: audit(full))
    _attempt("partial last window, 2 of 4 (8 + 8)", lambda: audit(equal))
    _attempt("partial last window, 8 + 4", lambda: audit(uneven))

    def carried_over() -> str:
        """The 2 micro-batches of a partial window, then 2 more (a next epoch's first)."""
        def step(candidate, micro_batches, make_optimizer) -> None:  # noqa: ANN001
            engine, _, _ = _engine(deepspeed, candidate, make_optimizer, 4)
            _run(engine, micro_batches[:2])  # the epoch ends here
            _run(engine, micro_batches[2:])  # the next epoch's first micro-batches

        result = audit_update(step, model, sample_classification_loss, full, sgd)
        return (f"after 2 + 2 micro-batches across the epoch boundary the update equals the"
                f" full-batch step over all 32 samples within 1e-5: {result.matches(1e-5)}"
                f" (norm ratio {result.norm_ratio:.3f})")

    _attempt("partial window's gradient carried into the next window", carried_over)

    def counts() -> str:
        epoch = split_into_micro_batches((inputs, labels), micro_batch_size=MICRO_BATCH)
        engine, optimizer, scheduler = _engine(deepspeed, copy.deepcopy(model), sgd, 4)
        stepped = [0]
        optimizer.register_step_post_hook(lambda *_: stepped.__setitem__(0, stepped[0] + 1))
        _run(engine, epoch)
        return (f"{len(epoch)} micro-batches, k = 4: optimizer steps {stepped[0]},"
                f" engine.global_steps {engine.global_steps}, engine.micro_steps"
                f" {engine.micro_steps}, scheduler steps {scheduler.last_epoch}")

    _attempt("one epoch", counts)

    def float64_window() -> str:
        result = audit_update(deepspeed_step(deepspeed, 4), copy.deepcopy(model).double(),
                              sample_classification_loss,
                              [(x.double(), y) for x, y in full], sgd)
        return f"norm ratio {result.norm_ratio:.3f}"

    _attempt("full window, float64 model", float64_window)

    return 0


if __name__ == "__main__":
    sys.exit(main())
