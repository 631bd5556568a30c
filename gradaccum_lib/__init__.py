"""gradaccum_lib: the helper package of the gradaccum teaching series.

The public contract (see docs/library.md): split a batch into micro-batches, compute accumulated
and full-batch gradients under the ``loss_fn(model, batch) -> (summed_loss, num_items)``
contract, and measure how far apart two sets of gradients are.
"""

from .batches import NonFiniteLossError, split_into_micro_batches
from .equivalence import accumulated_gradients, full_batch_gradients
from .gradients import max_gradient_difference

__all__ = [
    "NonFiniteLossError",
    "accumulated_gradients",
    "full_batch_gradients",
    "max_gradient_difference",
    "split_into_micro_batches",
]

__version__ = "0.1.0"
