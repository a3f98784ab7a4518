"""Streams that learn their own model and thresholds from their first readings."""
