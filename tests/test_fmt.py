"""The console formatters every command shares: durations and tables."""

import math

import pytest

from sim.fmt import duration, percent, table


@pytest.mark.parametrize("seconds, text", [
    (0.0072, "7.2 ms"), (0.02939, "29.4 ms"), (13.386, "13.4 s"), (75, "75 s"),
    (150, "2.5 min"), (3537, "59 min"), (5400, "1.5 h"), (36 * 3600, "36 h"),
    (3 * 86400, "3 days"), (0, "0 s"), (-2, "-2 s"),
])
def test_durations_switch_unit_as_they_grow(seconds, text):
    assert duration(seconds) == text


@pytest.mark.parametrize("value", [None, math.nan, math.inf, "soon", True])
def test_an_unknown_duration_is_a_dash(value):
    assert duration(value) == "-"


def test_percent():
    assert percent(0.8123) == "81.2%" and percent(0.8123, 2) == "81.23%"
    assert percent(None) == "-" and percent(math.nan) == "-"


def test_table_aligns_columns_with_rules_and_a_footer():
    text = table(["name", "n"], [["a", "1"], ["bbb", "22"]], footer=[["all", "23"]])
    assert text.splitlines() == ["name   n", "--------", "a      1", "bbb   22", "--------",
                                 "all   23"]


def test_table_rejects_a_ragged_row():
    with pytest.raises(ValueError, match="2 cells; expected 3"):
        table(["a", "b", "c"], [["1", "2"]])
