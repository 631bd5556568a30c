"""gradaccum_lib: the helper package of the gradaccum teaching series.

The public contract (see docs/library.md): split a batch into micro-batches, compute accumulated
and full-batch gradients under the ``loss_fn(model, batch) -> (summed_loss, num_items)``
contract, and measure how far apart two sets of gradients are.
"""

import os as _os

#: this process's parent, read before torch loads (about a second): a plain torchrun worker's
#: agent, which exports no pid; jobs.agent.run_worker exits if its parent is no longer this one
_PARENT_PID = _os.getppid()

from .batches import NonFiniteLossError, split_into_micro_batches  # noqa: E402
from .equivalence import accumulated_gradients, full_batch_gradients  # noqa: E402
from .gradients import max_gradient_difference  # noqa: E402

__all__ = [
    "NonFiniteLossError",
    "accumulated_gradients",
    "full_batch_gradients",
    "max_gradient_difference",
    "split_into_micro_batches",
]

__version__ = "0.1.0"
