"""A stream of many channels (a plant's 52 variables, a server's 38 metrics, up to 128), some
of them constant while it learns: it onboards, says which channels it found constant, watches
each of them by itself for any change and the others together, and stays quiet on normal
readings."""

from __future__ import annotations

import numpy as np
import pytest

from app.learning.learn import LearnedModel, learn
from app.monitoring.config import MahalanobisConfig
from app.monitoring.incidents import incident_spans
from app.schemas import MAX_CHANNELS
from app.streams.blocks import Readings
from app.streams.learning import monitor_revising

T0 = 1_700_000_000_000_000
LEARNING = 1000
CONSTANT = (3, 64, 127)  # channels that never moved while the stream learned


def plant(rng: np.random.Generator, count: int, channels: int) -> np.ndarray:
    """Channels driven by four shared autoregressive factors plus their own noise: correlated,
    as a plant's variables are; the `CONSTANT` ones sit at a set point."""
    factors = np.zeros((count, 4))
    shocks = rng.normal(0, 1, (count, 4))
    for t in range(1, count):
        factors[t] = 0.7 * factors[t - 1] + shocks[t]
    loadings = rng.normal(0, 1, (4, channels))
    values = 100 + factors @ loadings + rng.normal(0, 0.5, (count, channels))
    for c in CONSTANT:
        values[:, c] = 42.0
    return values


@pytest.fixture(scope="module")
def wide() -> tuple[LearnedModel, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    count = 3 * LEARNING
    values = plant(rng, count, MAX_CHANNELS)
    times = (T0 + np.arange(count) * 60_000_000).astype(np.int64)
    return learn(times[:LEARNING], values[:LEARNING]), times, values


def incidents_of(
    learned: LearnedModel, times: np.ndarray, values: np.ndarray
) -> list[tuple[int, int | None]]:
    events, _ = monitor_revising(learned, Readings.of_one(times, values), learned_from=LEARNING)
    return incident_spans(events)


def test_the_widest_stream_onboards_and_names_its_constant_channels(
    wide: tuple[LearnedModel, np.ndarray, np.ndarray],
) -> None:
    learned, _, _ = wide
    names = [f"c{c}" for c in range(MAX_CHANNELS)]
    summary = learned.summary(names)
    assert [c for c, name in enumerate(names) if summary[name]["constant"]] == list(CONSTANT)
    (joint,) = [d for d in learned.monitor.detectors if isinstance(d, MahalanobisConfig)]
    assert joint.watched == [c for c in range(MAX_CHANNELS) if c not in CONSTANT]


def test_normal_readings_raise_nothing_and_a_constant_channel_that_moves_does(
    wide: tuple[LearnedModel, np.ndarray, np.ndarray],
) -> None:
    learned, times, values = wide
    assert incidents_of(learned, times, values) == []
    moved = values.copy()
    moved[2 * LEARNING :, CONSTANT[1]] += 0.01  # a set point nudged by a hundredth
    incidents = incidents_of(learned, times, moved)
    assert len(incidents) == 1 and 2 * LEARNING <= incidents[0][0] < 2 * LEARNING + 5, incidents


def test_a_broken_correlation_is_caught_by_the_channels_together(
    wide: tuple[LearnedModel, np.ndarray, np.ndarray],
) -> None:
    """Two channels swap their readings: each stays inside its own range, the pair does not."""
    learned, times, values = wide
    swapped = values.copy()
    swapped[2 * LEARNING :, [0, 1]] = values[2 * LEARNING :, [1, 0]]
    events, _ = monitor_revising(learned, Readings.of_one(times, swapped), learned_from=LEARNING)
    first = min(events, key=lambda event: event.start)
    assert first.detector == "mahalanobis" and 2 * LEARNING <= first.start < 2 * LEARNING + 20
    assert len(incident_spans(events)) == 1  # one fault, one incident
