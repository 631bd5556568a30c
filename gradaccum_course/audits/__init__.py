"""Third-party accumulation loops held against the ground truth (``gradaccum_lib.equivalence``):
the bare loop and 🤗 Accelerate (``frameworks``), the 🤗 Trainer (``hf_trainer``) and PyTorch
Lightning (``lightning``)."""
