"""Fault injection: the lab's four faults and the sensor faults later issues need.

A fault is `{"type", "start", "end", ...}` in sample indices, `end` exclusive. Sensor faults touch
only the primary reading; the machine fault (`excitation`) re-simulates the machine, so the
reference sensor sees it too.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.errors import DataError
from app.simulation.twin import DuffingMachine, TwinRun, simulate


class FaultType(StrEnum):
    SPIKE = "spike"  # value += magnitude
    OFFSET = "offset"  # value += magnitude
    EXCITATION = "excitation"  # noise force *= factor (machine fault: both sensors)
    STUCK = "stuck"  # value frozen at the sample before start
    DRIFT = "drift"  # value += ramp from magnitude/len up to magnitude at end - 1
    GAIN = "gain"  # value *= factor
    DROPOUT = "dropout"  # value = 0
    MISSING = "missing"  # no reading (NaN, an empty CSV field)


_DEFAULT_MAGNITUDE = {FaultType.SPIKE: 1.5, FaultType.OFFSET: 0.8, FaultType.DRIFT: 1.0}
_DEFAULT_FACTOR = {FaultType.EXCITATION: 2.0, FaultType.GAIN: 1.5}


class Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", use_enum_values=False)

    type: FaultType
    start: int = Field(ge=0)
    end: int = Field(gt=0)
    magnitude: float | None = None
    factor: float | None = None

    @model_validator(mode="after")
    def _check(self) -> Fault:
        if self.end <= self.start:
            raise ValueError(f"end ({self.end}) must be after start ({self.start})")
        if self.type in _DEFAULT_MAGNITUDE:
            if self.factor is not None:
                raise ValueError(f"{self.type.value} takes 'magnitude', not 'factor'")
            if self.magnitude is None:
                self.magnitude = _DEFAULT_MAGNITUDE[self.type]
        elif self.type in _DEFAULT_FACTOR:
            if self.magnitude is not None:
                raise ValueError(f"{self.type.value} takes 'factor', not 'magnitude'")
            if self.factor is None:
                self.factor = _DEFAULT_FACTOR[self.type]
        elif self.magnitude is not None or self.factor is not None:
            raise ValueError(f"{self.type.value} takes neither 'magnitude' nor 'factor'")
        if self.type is FaultType.STUCK and self.start == 0:
            raise ValueError("a stuck fault needs a sample before it to freeze at")
        return self

    def as_json(self) -> dict[str, object]:
        return self.model_dump(mode="json", exclude_none=True)


LAB_FAULTS: tuple[Fault, ...] = (
    Fault(type=FaultType.SPIKE, start=7100, end=7101, magnitude=1.5),
    Fault(type=FaultType.OFFSET, start=7250, end=7350, magnitude=0.8),
    Fault(type=FaultType.EXCITATION, start=7450, end=7750, factor=2.0),
    Fault(type=FaultType.STUCK, start=7850, end=7950),
)


def parse_faults(raw: object, source: str = "schedule") -> list[Fault]:
    if not isinstance(raw, list):
        raise DataError(f"{source}: expected a JSON list of faults")
    faults: list[Fault] = []
    for index, item in enumerate(raw):
        try:
            faults.append(Fault.model_validate(item))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'fault'}: {e['msg']}" for e in exc.errors()
            )
            raise DataError(f"{source}: fault #{index}: {problems}") from None
    return faults


def load_schedule(path: str | Path) -> list[Fault]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON: {exc}") from None
    return parse_faults(raw, str(path))


def write_schedule(faults: list[Fault] | tuple[Fault, ...], path: str | Path) -> None:
    Path(path).write_text(json.dumps([f.as_json() for f in faults], indent=1) + "\n")


def inject_faults(
    seed: int,
    n_samples: int,
    faults: list[Fault] | tuple[Fault, ...],
    machine: DuffingMachine | None = None,
) -> TwinRun:
    """Simulate the machine with `faults`: machine faults first (re-simulation), then sensors."""
    for fault in faults:
        if fault.end > n_samples:
            raise DataError(
                f"{fault.type.value} fault ends at {fault.end}, after the {n_samples} samples"
            )
    scale = np.ones(n_samples)
    for fault in faults:
        if fault.type is FaultType.EXCITATION:
            assert fault.factor is not None
            scale[fault.start : fault.end] *= fault.factor
    has_machine_fault = any(f.type is FaultType.EXCITATION for f in faults)
    run = simulate(
        seed, n_samples, machine=machine, excitation_scale=scale if has_machine_fault else None
    )
    value = run.value.copy()
    for fault in sorted(faults, key=lambda f: f.start):
        window = slice(fault.start, fault.end)
        length = fault.end - fault.start
        if fault.type in (FaultType.SPIKE, FaultType.OFFSET):
            assert fault.magnitude is not None
            value[window] += fault.magnitude
        elif fault.type is FaultType.DRIFT:
            assert fault.magnitude is not None
            value[window] += fault.magnitude * np.arange(1, length + 1) / length
        elif fault.type is FaultType.STUCK:
            value[window] = value[fault.start - 1]
        elif fault.type is FaultType.GAIN:
            assert fault.factor is not None
            value[window] *= fault.factor
        elif fault.type is FaultType.DROPOUT:
            value[window] = 0.0
        elif fault.type is FaultType.MISSING:
            value[window] = np.nan
    return TwinRun(
        displacement=run.displacement,
        value=value,
        reference=run.reference,
        sample_period_s=run.sample_period_s,
    )
