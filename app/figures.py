"""Figures are drawn by matplotlib, the `plots` extra (`pip install 'twinwatch[plots]'`): the
service never draws one, and its image leaves it out."""

from __future__ import annotations

import importlib.util

from app.errors import AppError

INSTALL = "pip install 'twinwatch[plots]'"


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def require_matplotlib() -> None:
    """A clear error where a figure is asked for and matplotlib is not installed: call it
    before the work the figure shows, not after."""
    if not have_matplotlib():
        raise AppError(f"figures need matplotlib, which is not installed: {INSTALL}")
