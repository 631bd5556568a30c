"""The conformance table (issue 50): each installed framework's accumulation path × a set of
scenarios, measured against the library's ground truth. ``scenarios`` lays out the windows and
the truth's loss; one module per framework runs its path (``trainer``, ``accelerate``,
``lightning``, ``trl``), ``two_ranks`` runs any of them on 2 gloo ranks under torchrun, and
``moe`` holds the MoE column's model, its truth's loss and the update's split in two parts;
``verdicts`` holds what the pinned versions are expected to show, each deviation's thread and
its program; ``table`` writes the JSON, the heat-map and the page in English and (``zh``, its
words) in Chinese; ``repro`` holds one program of at most 60 lines per deviating cause."""
