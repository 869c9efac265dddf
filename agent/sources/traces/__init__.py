"""Trace formats: one module per format (its sniff and parse) registered in ``registry``, and their readers."""
