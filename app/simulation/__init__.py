"""The built-in digital twin: a forced Duffing oscillator and fault injection (pure numpy)."""

from app.simulation.faults import LAB_FAULTS, Fault, FaultType, inject_faults, load_schedule
from app.simulation.twin import DuffingMachine, TwinRun, simulate, simulate_series

__all__ = [
    "LAB_FAULTS",
    "DuffingMachine",
    "Fault",
    "FaultType",
    "TwinRun",
    "inject_faults",
    "load_schedule",
    "simulate",
    "simulate_series",
]
