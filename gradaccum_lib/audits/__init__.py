"""Third-party accumulation loops held against the ground truth (``gradaccum_lib.equivalence``):
🤗 Accelerate and the bare loops (``frameworks``), the 🤗 Trainer (``hf_trainer``) and
PyTorch Lightning (``lightning``)."""
