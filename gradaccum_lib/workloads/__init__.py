"""What the series trains on: toy sets and the shipped EMR corpus with its tokenizer
(``data``), the corpus generator and datasheet (``emr_corpus``, ``python -m``), and model
builders from configs (``models``)."""
