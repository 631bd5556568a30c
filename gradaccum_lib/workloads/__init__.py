"""What the series trains on: toy sets and the shipped EMR corpus with its labels and
tokenizer (``data``; ``scripts/make_emr_corpus.py`` wrote the corpus), and model builders from
configs (``models``)."""
