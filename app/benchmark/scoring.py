"""Scores of a detector's 0/1 alarm state against labelled rows. Pure numpy.

Two families:

- events, as an operator sees them: a labelled anomaly (a run of anomaly rows) is caught when an
  incident (a run of alarmed rows) overlaps it; precision is the share of incidents that
  overlap one; the delay is from the anomaly's first row to its first alarmed row; false alarms
  per day are incidents that start on a normal row, over the normal rows' time;
- SKAB's leaderboard protocol, so figures sit beside its published table:
  outlier detection (TP, FP, FN and TN summed over all files, then F1 = TP / (TP + (FP + FN)
  / 2), FAR = FP / (FP + TN), MAR = FN / (FN + TP)) and changepoint detection (NAB scoring:
  each labelled changepoint opens a window to its right (a window that would overlap the
  previous one starts where the previous one ends); the first predicted changepoint (a row where
  the 0/1 state changes) in a window earns a credit falling from +1 at the changepoint to A_fp
  at the window's end along a tanh; an empty window costs A_fn; each predicted changepoint
  outside every window costs A_fp; scores are summed over files and normalised so that the
  detector that predicts nothing scores 0 and the perfect one 100).

The window's length follows a rule (`nab_window_s`): `skab`, SKAB's fixed 60 s, for figures
beside its leaderboard; `nab`, NAB's own rule, for data at any pace: 10 % of the scored part's
duration shared among its labelled anomalies (at least one sample period). A fixed 60 s holds
one row of 3-minute data and an hour of 1 Hz data; NAB's rule gives every file the same share.
A file without anomalies has no window under `nab`: only its false changes cost.

The budget (`budget_check`): a stream is given a number of false alarms a day. A file kept it
when its false incidents (incidents starting on a normal row) are at most the 99th percentile of
a Poisson count whose mean is the budget times the normal rows' days. The slack: a stream that
raises exactly its budget on average fails the check in at most 1 % of files, so a few files
of a large set fail by chance; on short files the allowance is strict (a mean under 0.01, such
as one SKAB file at one alarm a day, allows none), on long ones it nears the budget (a mean of
1 allows 4, of 10 allows 18).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy.stats import poisson

from app.errors import DataError

PROFILES: dict[str, tuple[float, float]] = {
    "standard": (-0.11, -1.0),
    "low_fp": (-0.22, -1.0),
    "low_fn": (-0.11, -2.0),
}
"""NAB profiles: (A_fp, A_fn); a detected window earns at most A_tp = 1."""
WindowRule = Literal["nab", "skab"]
WINDOW_RULES: tuple[WindowRule, ...] = ("nab", "skab")
SKAB_WINDOW_S = 60.0
"""SKAB's changepoint window, whatever the data's pace."""
NAB_WINDOW_SHARE = 0.10
"""NAB's windows: this share of a file's scored duration, split among its anomalies."""
BUDGET_QUANTILE = 0.99
"""A file kept its budget when its false incidents are at most this quantile of Poisson's."""
_CREDIT_STEPS = 1000


def window_rule(name: str) -> WindowRule:
    """`--window`'s text as a rule."""
    for rule in WINDOW_RULES:
        if name == rule:
            return rule
    raise DataError(f"the changepoint window is one of {', '.join(WINDOW_RULES)}, got {name!r}")


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of each run of True."""
    padded = np.concatenate(([False], np.asarray(mask, dtype=bool), [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _credit(position: float, a_fp: float) -> float:
    """The tanh-shaped credit of a detection at `position` in [0, 1] of its window."""
    x = np.linspace(-np.pi / 2, np.pi / 2, _CREDIT_STEPS)
    y = (1 - a_fp) / 2 * -np.tanh(x) / np.tanh(np.pi / 2) + (1 - a_fp) / 2 + a_fp
    return float(y[min(int(position * _CREDIT_STEPS), _CREDIT_STEPS - 1)])


def nab_window_s(
    rule: WindowRule, times_s: np.ndarray, anomaly: np.ndarray, period_s: float
) -> float | None:
    """The changepoint window of one file's scored rows (times in seconds); None: no window
    (`nab` on a file without anomalies)."""
    if rule == "skab":
        return SKAB_WINDOW_S
    anomalies = len(runs(anomaly))
    if not anomalies:
        return None
    duration = float(times_s[-1] - times_s[0]) + period_s  # R readings cover R periods
    return max(period_s, NAB_WINDOW_SHARE * duration / anomalies)


def nab(
    times: np.ndarray,
    changepoints: np.ndarray,
    predicted: np.ndarray,
    window_s: float | None = SKAB_WINDOW_S,
) -> dict[str, tuple[float, float, float]]:
    """One file's NAB (score, null score, perfect score) per profile; times in seconds.
    `window_s` None: no window, each predicted change costs A_fp."""
    state = np.asarray(predicted, dtype=bool)
    changes = np.zeros(state.shape[0], dtype=bool)
    if state.shape[0]:
        changes[0] = state[0]
        changes[1:] = state[1:] != state[:-1]
    moments = times[changes]
    windows: list[list[float]] = []
    if window_s is not None:
        windows = [[float(t), float(t) + window_s] for t in times[np.asarray(changepoints, bool)]]
    for i in range(len(windows) - 1):
        if windows[i][1] >= windows[i + 1][0]:
            windows[i + 1][0] = windows[i][1]
    out = {}
    for profile, (a_fp, a_fn) in PROFILES.items():
        score, covered = 0.0, np.zeros(moments.shape[0], dtype=bool)
        for low, high in windows:
            inside = (moments >= low) & (moments <= high)
            covered |= inside
            if inside.any():
                first = float(moments[inside][0])
                score += _credit((first - low) / (high - low) if high > low else 0.0, a_fp)
            else:
                score += a_fn
        score += a_fp * float((~covered).sum())
        out[profile] = (score, a_fn * len(windows), float(len(windows)))
    return out


@dataclass(frozen=True)
class Budget:
    """Whether one file's false incidents kept to its stream's budget (see the module)."""

    allowed: int
    false_incidents: int
    kept: bool
    normal_days: float

    def as_json(self) -> dict[str, Any]:
        return {
            "allowed": self.allowed,
            "false_incidents": self.false_incidents,
            "kept": self.kept,
            "normal_days": self.normal_days,
        }


def budget_check(false_incidents: int, normal_days: float, false_alarms_per_day: float) -> Budget:
    """The false incidents a file may have at its budget, and whether it kept to them."""
    mean = false_alarms_per_day * normal_days
    allowed = int(poisson.ppf(BUDGET_QUANTILE, mean)) if mean > 0 else 0
    return Budget(allowed, false_incidents, false_incidents <= allowed, normal_days)


@dataclass
class FileScore:
    """One file's alarm state against its labels (the scored rows only)."""

    name: str
    rows: int
    confusion: tuple[int, int, int, int]  # TP, FP, FN, TN
    nab: dict[str, tuple[float, float, float]]
    anomalies: int
    caught: int
    incidents: int
    true_incidents: int
    false_incidents: int
    delays_s: list[float]
    incidents_per_anomaly: list[int]
    normal_days: float
    nab_window_s: float | None
    budget: Budget
    extra: dict[str, Any] = field(default_factory=dict)


def score_file(
    name: str,
    times_s: np.ndarray,
    anomaly: np.ndarray,
    changepoint: np.ndarray | None,
    alarmed: np.ndarray,
    period_s: float,
    incidents: list[tuple[int, int]] | None = None,
    *,
    window: WindowRule = "nab",
    false_alarms_per_day: float = 1.0,
) -> FileScore:
    """Score the scored rows of one file (times in seconds). `incidents`: [start, stop) rows
    of the service's incidents (default: each run of alarmed rows); `window`: the changepoint
    window's rule; `false_alarms_per_day`: the budget the detector was given."""
    anomaly = np.asarray(anomaly, dtype=bool)
    alarmed = np.asarray(alarmed, dtype=bool)
    tp = int((anomaly & alarmed).sum())
    fp = int((~anomaly & alarmed).sum())
    fn = int((anomaly & ~alarmed).sum())
    tn = int((~anomaly & ~alarmed).sum())
    events = runs(anomaly)
    incidents = runs(alarmed) if incidents is None else incidents
    delays, per_event, caught = [], [], 0
    for start, stop in events:
        overlapping = [i for i in incidents if i[0] < stop and i[1] > start]
        per_event.append(len(overlapping))
        if overlapping:
            caught += 1
            first = max(start, overlapping[0][0])
            delays.append(float(times_s[first] - times_s[start]))
    true_incidents = sum(1 for a, b in incidents if anomaly[a:b].any())
    false_incidents = sum(1 for a, _ in incidents if not anomaly[min(a, anomaly.shape[0] - 1)])
    normal_days = float((~anomaly).sum()) * period_s / 86_400.0
    window_s = nab_window_s(window, times_s, anomaly, period_s)
    return FileScore(
        name=name,
        rows=int(anomaly.shape[0]),
        confusion=(tp, fp, fn, tn),
        nab=nab(times_s, changepoint, alarmed, window_s) if changepoint is not None else {},
        anomalies=len(events),
        caught=caught,
        incidents=len(incidents),
        true_incidents=true_incidents,
        false_incidents=false_incidents,
        delays_s=delays,
        incidents_per_anomaly=per_event,
        normal_days=normal_days,
        nab_window_s=window_s,
        budget=budget_check(false_incidents, normal_days, false_alarms_per_day),
    )


def summary(scores: list[FileScore]) -> dict[str, Any]:
    """Every file's score added up (SKAB's protocol sums the confusion and the NAB scores
    before dividing)."""
    tp, fp, fn, tn = (sum(s.confusion[i] for s in scores) for i in range(4))
    out: dict[str, Any] = {
        "files": len(scores),
        "rows": sum(s.rows for s in scores),
        "f1": _ratio(tp, tp + (fp + fn) / 2),
        "far_percent": _percent(fp, fp + tn),
        "mar_percent": _percent(fn, fn + tp),
        "confusion": {"tp": tp, "fp": fp, "fn": fn, "tn": tn},
    }
    with_changepoints = [s for s in scores if s.nab]
    if with_changepoints:
        for profile in PROFILES:
            score, null, perfect = (
                sum(s.nab[profile][i] for s in with_changepoints) for i in range(3)
            )
            out[f"nab_{profile}"] = (
                100 * (score - null) / (perfect - null) if perfect > null else None
            )
    anomalies = sum(s.anomalies for s in scores)
    incidents = sum(s.incidents for s in scores)
    delays = [d for s in scores for d in s.delays_s]
    per_event = [n for s in scores for n in s.incidents_per_anomaly]
    normal_days = sum(s.normal_days for s in scores)
    false_incidents = sum(s.false_incidents for s in scores)
    out["events"] = {
        "anomalies": anomalies,
        "caught": sum(s.caught for s in scores),
        "recall": _ratio(sum(s.caught for s in scores), anomalies),
        "incidents": incidents,
        "precision": _ratio(sum(s.true_incidents for s in scores), incidents),
        "false_incidents": false_incidents,
        "false_alarms_per_day": _ratio(false_incidents, normal_days),
        "median_delay_s": float(np.median(delays)) if delays else None,
        "incidents_per_anomaly": float(np.mean(per_event)) if per_event else None,
    }
    out["budget"] = {"files": len(scores), "kept": sum(s.budget.kept for s in scores)}
    return out


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _percent(a: float, b: float) -> float | None:
    return 100 * a / b if b else None
