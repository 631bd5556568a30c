"""Instruments the notebooks measure with: saved-tensor bytes and the memory budget
(``memory``), the interleaved timer (``bench``), the gradient noise scale (``noise``),
evaluation (``metrics``), time x memory plans on one device and on a cluster (``planning``)
and the teaching DDP comm counter (``comm``)."""
