"""Residual detectors, alarm rules and calibration."""
