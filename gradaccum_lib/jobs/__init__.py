"""Programs that ``torchrun`` runs around the engine (``train``, with its
command line; ``ddp``, ``memory_probe``, ``step_times``), running torchrun from Python in two
halves named for the side they run on (``launch``: the caller's, ``launch()``; ``agent``: the
processes it starts, their supervisor and ``run_worker``), checkpoint files (``checkpoints``)
and exact resume (``resume``)."""
