"""Keras models from the source papers (built uncompiled, for TFF tasks and FLOP counts)."""
