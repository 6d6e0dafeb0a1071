"""Evaluation metrics for evald: sample quality, classification, and user plugins.

May import: nothing of evald.
"""
