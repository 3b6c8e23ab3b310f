"""Quantities in the unit that fits them (a cache refusal once read \"needs ~0.00 GB\")."""

import pytest

from taps_train.units import duration, size


@pytest.mark.parametrize("count, text", [(0, "0 B"), (999, "999 B"), (3_400, "3.4 kB"), (12_000_000, "12 MB"), (1.25e9, "1.25 GB"),
                                         (250e9, "250 GB")])
def test_sizes_read_in_the_unit_that_fits(count, text):
    assert size(count) == text


def test_durations_read_in_minutes_or_hours():
    assert [duration(s) for s in (40, 125, 3725)] == ["0m40s", "2m05s", "1h02m"]
