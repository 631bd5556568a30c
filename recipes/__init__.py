"""Training jobs built on gradaccum_lib, each run by plain ``torchrun`` (``recipes/<name>/``)."""
