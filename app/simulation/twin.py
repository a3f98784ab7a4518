"""The reference machine (the built-in digital twin): a forced, damped Duffing oscillator on a
stiff mount.

The oscillator is chaotic, so the order of floating-point operations is part of the model:
`_integrate` is a literal transcription of the equation of motion (semi-implicit Euler, 10
sub-steps per sample) and reproduces the reference CSV bit for bit.
Do not "simplify" it (x*x*x for x**3, t += dt for t = k*dt): the trajectory would diverge after
a few hundred samples. A checksum test guards it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from app.series import REFERENCE_COLUMN, VALUE_COLUMN, Series

SUBSTEPS_PER_SAMPLE = 10


@dataclass(frozen=True)
class DuffingMachine:
    """x'' + 2 zeta omega0 x' + omega0^2 x + k3 x^3 = A sin(2 pi t / period) + noise force."""

    omega0: float = math.pi
    zeta: float = 0.05
    k3: float = 40.0
    amplitude: float = 3.0
    period_s: float = 5.0
    noise_force: float = 3.0
    dt: float = 0.01
    drift_per_sample: float = 1e-3
    measurement_noise: float = 0.05

    @property
    def sample_period_s(self) -> float:
        return self.dt * SUBSTEPS_PER_SAMPLE


@dataclass(frozen=True)
class TwinRun:
    """One simulated record: the true displacement and the two sensors that watch it."""

    displacement: np.ndarray
    value: np.ndarray
    reference: np.ndarray
    sample_period_s: float

    def to_series(self) -> Series:
        t = np.arange(self.value.shape[0]) / round(1.0 / self.sample_period_s)
        return Series(
            t=t, columns={VALUE_COLUMN: self.value.copy(), REFERENCE_COLUMN: self.reference.copy()}
        )


def _integrate(
    machine: DuffingMachine, force_noise: np.ndarray, force_scale: np.ndarray | None, n: int
) -> np.ndarray:
    """Semi-implicit Euler, the sample taken after its 10 sub-steps. Evaluation order is pinned."""
    A = machine.amplitude
    P = machine.period_s
    zeta = machine.zeta
    omega0 = machine.omega0
    k3 = machine.k3
    sigma_f = machine.noise_force
    dt = machine.dt
    sqrt_dt = math.sqrt(dt)
    noise = force_noise.tolist()
    scale = force_scale.tolist() if force_scale is not None else None
    x = 0.0
    v = 0.0
    out = [0.0] * n
    sin = math.sin
    pi = math.pi
    for k in range(n * SUBSTEPS_PER_SAMPLE):
        t = k * dt
        acc = A * sin(2 * pi * t / P) - 2 * zeta * omega0 * v - omega0**2 * x - k3 * x**3
        s = 1.0 if scale is None else scale[k]
        v += dt * acc + sigma_f * s * sqrt_dt * noise[k]
        x += dt * v
        if (k + 1) % SUBSTEPS_PER_SAMPLE == 0:
            out[k // SUBSTEPS_PER_SAMPLE] = x
    return np.asarray(out, dtype=np.float64)


def simulate(
    seed: int,
    n_samples: int,
    *,
    machine: DuffingMachine | None = None,
    excitation_scale: np.ndarray | None = None,
) -> TwinRun:
    """Simulate `n_samples` readings of the primary and the redundant reference sensor.

    `excitation_scale` (one factor per sample) multiplies the noise force on that sample's
    sub-steps: the `excitation` machine fault. The random draws do not depend on it, so a
    faulted run is identical to the clean one before the fault starts.
    """
    if n_samples < 1:
        raise ValueError("n_samples must be at least 1")
    machine = machine or DuffingMachine()
    rng = np.random.default_rng(seed)
    force_noise = rng.standard_normal(n_samples * SUBSTEPS_PER_SAMPLE)
    measurement_noise = rng.standard_normal(n_samples)
    reference_noise = rng.standard_normal(n_samples)
    substep_scale = None
    if excitation_scale is not None:
        if excitation_scale.shape != (n_samples,):
            raise ValueError("excitation_scale needs one factor per sample")
        substep_scale = np.repeat(excitation_scale.astype(np.float64), SUBSTEPS_PER_SAMPLE)
    x = _integrate(machine, force_noise, substep_scale, n_samples)
    level = machine.drift_per_sample * np.arange(n_samples)
    value = x + level + machine.measurement_noise * measurement_noise
    reference = x + level + machine.measurement_noise * reference_noise
    return TwinRun(
        displacement=x,
        value=value,
        reference=reference,
        sample_period_s=machine.sample_period_s,
    )


def simulate_series(seed: int, n_samples: int, machine: DuffingMachine | None = None) -> Series:
    return simulate(seed, n_samples, machine=machine).to_series()
