"""The case study as a real job (``train``: its command line, epochs, checkpoints and exact
resume; ``checkpoints``: atomic, hashed files), and running torchrun from Python in two halves
named for the side they run on (``launch``: the caller's, ``launch()``; ``agent``: the
processes it starts, their supervisor and ``run_worker``)."""
