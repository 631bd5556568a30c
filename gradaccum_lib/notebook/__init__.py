"""Notebook furniture: figures, returned and never saved (``plots``); sliders bound to pure
functions (``widgets``); the exercises and their checkers (``exercises``), which compute the
truth with the library and answer with one line, never a traceback."""
