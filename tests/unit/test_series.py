from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.errors import DataError
from app.series import Series, read_csv, write_csv


def test_round_trip_keeps_every_bit_and_missing_values(tmp_path: Path) -> None:
    series = Series(
        t=np.array([0.0, 0.1, 0.2]),
        columns={
            "value": np.array([1 / 3, np.nan, -2e-17]),
            "reference": np.array([1.0, 2.0, 3.0]),
        },
    )
    write_csv(series, tmp_path / "s.csv")
    back = read_csv(tmp_path / "s.csv")
    np.testing.assert_array_equal(back.t, series.t)
    np.testing.assert_array_equal(back.value, series.value)
    assert back.sha256() == series.sha256()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file"),
        ("time,value\n0,1\n", "expected 't,value'"),
        ("t,reference\n0,1\n", "expected 't,value'"),
        ("t,value\n", "no samples"),
        ("t,value\n0,1,2\n", "3 fields"),
        ("t,value\n0,abc\n", "value is 'abc', not a number"),
        ("t,value\n0,inf\n", "infinite"),
        ("t,value\n0,1\n0,2\n", "time does not increase"),
        ("t,value,value\n0,1,2\n", "duplicate"),
    ],
)
def test_bad_csv_is_refused_with_a_clear_message(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        read_csv(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        read_csv(tmp_path / "nope.csv")


def test_unknown_channel_is_named(seed0: Series) -> None:
    with pytest.raises(DataError, match="unknown channel"):
        seed0.matrix(["value", "load"])
    assert seed0.matrix(["value", "reference"]).shape == (8000, 2)
