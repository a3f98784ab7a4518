from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.errors import DataError
from app.simulation.faults import FaultType, load_schedule, parse_faults


def test_defaults_fill_each_types_magnitude() -> None:
    faults = parse_faults(
        [{"type": "spike", "start": 1, "end": 2}, {"type": "gain", "start": 3, "end": 9}]
    )
    assert faults[0].magnitude == 1.5
    assert faults[1].factor == 1.5
    assert faults[1].type is FaultType.GAIN


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"type": "spike"}, "expected a JSON list"),
        ([{"type": "meteor", "start": 1, "end": 2}], "fault #0: type"),
        ([{"type": "spike", "start": 5, "end": 5}], "must be after start"),
        ([{"type": "spike", "start": -1, "end": 5}], "start"),
        ([{"type": "stuck", "start": 0, "end": 5}], "sample before it"),
        ([{"type": "offset", "start": 1, "end": 5, "factor": 2}], "takes 'magnitude'"),
        ([{"type": "stuck", "start": 1, "end": 5, "magnitude": 2}], "neither"),
        ([{"type": "spike", "start": 1, "end": 5, "colour": "red"}], "colour"),
    ],
)
def test_bad_schedules_are_refused_with_the_reason(raw: object, message: str) -> None:
    with pytest.raises(DataError, match=message):
        parse_faults(raw)


def test_schedule_file_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_schedule(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    with pytest.raises(DataError, match="not valid JSON"):
        load_schedule(broken)
    good = tmp_path / "good.json"
    good.write_text(json.dumps([{"type": "dropout", "start": 10, "end": 20}]))
    assert load_schedule(good)[0].type is FaultType.DROPOUT
