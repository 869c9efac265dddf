"""Streaming analyzers: pure, vectorised, no I/O. ``update`` folds events in, ``snapshot`` reports."""
