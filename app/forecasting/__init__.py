"""Forecasters (baselines, linear AR, LSTM), training, walk-forward evaluation, artifacts."""
