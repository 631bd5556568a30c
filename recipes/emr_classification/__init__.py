"""The series' case study as a recipe: Chinese EMR disease classification with a BERT-style
model, trained with gradient accumulation under ``torchrun`` (README.md here)."""
