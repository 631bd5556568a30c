"""Programs that ``torchrun`` runs around the engine (``train``, ``ddp``, ``fsdp_probe``,
``step_times``), the torchrun worker's entry point (``worker``), ``launch()`` with whole-tree
cleanup (``launcher``), checkpoint files (``checkpoints``) and exact resume (``resume``)."""
