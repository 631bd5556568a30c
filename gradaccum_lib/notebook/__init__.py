"""Notebook furniture: figures, returned and never saved (``plots``); sliders bound to pure
functions (``widgets``); exercise checkers (``exercises``)."""
