"""Thresholds that keep learning: a learned stream's thresholds re-fitted on the normal readings
it has seen since, in the manner of streaming peaks-over-threshold (SPOT/DSPOT, Siffer et al.,
KDD 2017), bounded.

Each time the stream's readings have doubled (at twice, four and eight times its learning
period, and so on, until `REVISE_EVERY` learning periods lie between two revisions: then
every `REVISE_EVERY` learning periods), its thresholds are fitted again by the same rules as
at learning (`detectors_for`), on the residuals of every reading since it started that no
alarm of the stream covered (its learning readings included: they are normal by decree;
samples inside alarms, and their quiet spells, are never evidence of normal). A threshold
fitted on a few hundred readings rests on little, and one fitted on twice as many is much
surer: early revisions are where a short learning period's thresholds gain most (a process
plant's eight hours of learning do not show the slow swings of its next two days). Each new
threshold is kept within [1, 2] x the learned one:

- never below: a learning period's thresholds are the floor (a quiet month does not make the
  next normal burst an alarm);
- at most twice: a fault that develops slowly enough to stay under its thresholds for a whole
  revision period could otherwise teach them to accept it; twice the learned threshold is the
  most it can gain, so a drift keeps growing into an alarm.

A revision applies from the reading after it is adopted; the readings before it keep the alarms
they raised. Which detectors a stream has and their windows never change: only gains and
thresholds move, so a stream's state carries over unchanged.
"""

from __future__ import annotations

import numpy as np

from app.learning.learn import LearnedModel
from app.learning.thresholds import ChannelScale, detectors_for
from app.monitoring.config import MonitorConfig, RollingRMSConfig
from app.monitoring.detectors import DETECTORS

REVISE_EVERY = 10
"""The most learning periods of readings between two revisions."""
REVISE_AT_LEAST = 100
"""The fewest readings between two revisions."""
MOST_GAIN = 2.0


def next_revision(learned: LearnedModel, last: int) -> int:
    """The sample at which a learned stream's thresholds are fitted again after the fit (its
    learning, or its last revision) made at sample `last` (see the module)."""
    return last + min(max(last, REVISE_AT_LEAST), REVISE_EVERY * learned.readings)


def refit(
    learned: LearnedModel,
    residuals: np.ndarray,
    values: np.ndarray,
    *,
    normal: np.ndarray,
    missing: np.ndarray,
    reference_gaps: np.ndarray | None,
    false_alarms_per_day: float,
    rms_window: int | None = None,
) -> tuple[MonitorConfig, list[ChannelScale]]:
    """The detectors and thresholds the learning rules give for `false_alarms_per_day` on the
    readings marked `normal` (R,) (residuals (R, C) of the learned model, readings (R, C),
    null flags (R,), reference gaps), with no bound: a revision bounds them (`revise`), a
    recalibration asked for on a period of normal operation takes them as they are (its
    rolling RMS's window too, unless `rms_window` is given)."""
    return detectors_for(
        np.where(normal[:, None], residuals, np.nan),
        values,
        [fit.offset for fit in learned.fits],
        missing=np.where(normal, missing, np.nan),
        sample_period_s=learned.sample_period_s,
        false_alarms_per_day=false_alarms_per_day,
        reference_gaps=None if reference_gaps is None else np.where(normal, reference_gaps, np.nan),
        rms_window=rms_window,
    )


def revise(
    learned: LearnedModel,
    residuals: np.ndarray,
    values: np.ndarray,
    *,
    normal: np.ndarray,
    missing: np.ndarray,
    reference_gaps: np.ndarray | None = None,
) -> MonitorConfig:
    """The learned monitor with thresholds re-fitted on the readings marked `normal` (R,):
    residuals (R, C) of the learned model, readings (R, C), null flags (R,), reference gaps."""
    fresh, _ = refit(
        learned,
        residuals,
        values,
        normal=normal,
        missing=missing,
        reference_gaps=reference_gaps,
        false_alarms_per_day=learned.false_alarms_per_day,
        rms_window=next(
            (d.window for d in learned.monitor.detectors if isinstance(d, RollingRMSConfig)),
            None,
        ),
    )
    refitted = {detector.kind: detector for detector in fresh.detectors}
    detectors = []
    for base in learned.monitor.detectors:
        new = refitted.get(base.kind)
        if new is None or base.kind == "missing":
            detectors.append(base)
        elif base.gains is not None and new.gains is not None:
            # gain = 1 / threshold: a threshold within [1, 2] x is a gain within [1/2, 1] x;
            # for a detector alarming below its threshold (the variance floor), less sensitive
            # is a lower threshold: a gain within [1, 2] x.
            below = DETECTORS[base.kind].direction == "below"
            low, high = (1.0, MOST_GAIN) if below else (1 / MOST_GAIN, 1.0)
            gains = [
                g if g == 0 else float(np.clip(n, g * low, g * high))
                for g, n in zip(base.gains, new.gains, strict=True)
            ]
            detectors.append(base.model_copy(update={"gains": gains}))
        else:
            threshold = float(np.clip(new.threshold, base.threshold, MOST_GAIN * base.threshold))
            detectors.append(base.model_copy(update={"threshold": threshold}))
    return learned.monitor.model_copy(update={"detectors": detectors})
