"""Figures need the `plots` extra: without matplotlib, asking for one says how to get it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from app.benchmark.report import benchmark
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


def test_asking_for_a_figure_without_matplotlib_fails_before_the_work(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`--plots` without the extra is refused at once, not after the run it would draw."""
    monkeypatch.setattr("app.figures.have_matplotlib", lambda: False)

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the work ran before the refusal")

    monkeypatch.setattr("app.benchmark.report.learning_rows", never)
    with pytest.raises(AppError, match="twinwatch\\[plots\\]"):
        benchmark([object()], learn="0.2", plots=tmp_path)  # type: ignore[list-item]
