"""Figures need the `plots` extra: without matplotlib, asking for one says how to get it."""

from __future__ import annotations

import importlib.util

import pytest

from app.errors import AppError
from app.figures import require_matplotlib


def test_a_figure_without_matplotlib_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name)
    )
    with pytest.raises(AppError, match=r"pip install 'twinwatch\[plots\]'"):
        require_matplotlib()


def test_with_matplotlib_figures_are_drawn() -> None:
    require_matplotlib()  # the test environment has the extra
