"""Programs that ``torchrun`` runs around the engine (``train``, with its command line in
``train_args``; ``ddp``, ``memory_probe``, ``step_times``), the torchrun worker's and agent's
entry points (``worker``), ``launch()`` (``launcher``) and how its runs end with their caller
(``run_cleanup``), checkpoint files (``checkpoints``) and exact resume (``resume``)."""
