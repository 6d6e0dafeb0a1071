"""Evaluation metrics for evald: sample quality, classification, and user plugins."""
