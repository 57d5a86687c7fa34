"""The one home of durations (``gpudiag/durations.py``): what people type, Slurm's and
Prometheus' spellings, each read by one function."""

from __future__ import annotations

import click
import pytest

from gpudiag.durations import format_duration, parse_duration, prom_duration, slurm_duration


@pytest.mark.parametrize("text, seconds", [
    ("15s", 15.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h2m3s", 3723.0), ("2d", 172800.0),
    ("1w", 604800.0), ("1y", 31536000.0), ("0s", 0.0),
])
def test_prom_duration_reads_prometheus_compound_durations(text, seconds):
    assert prom_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "15", "1.5s", " 15s", "15s ", "15 s", "1m30", "abc", "15x", "-1s"])
def test_prom_duration_is_none_for_what_prometheus_would_not_print(text):
    assert prom_duration(text) is None


def test_prometheus_targets_are_read_through_durations():
    """prom_client keeps no unit table of its own: its scrape intervals are ``prom_duration``'s."""
    from gpudiag.live import prom_client

    assert prom_client.prom_duration is prom_duration
    assert not hasattr(prom_client, "parse_prom_duration")


def test_typed_durations_and_slurm_times():
    assert parse_duration("10m", "--x") == 600.0
    assert parse_duration("2w", "--x") == 14 * 86400.0
    with pytest.raises(click.BadParameter, match="use e.g."):
        parse_duration("1m30s", "--x")
    assert format_duration(600) == "10m"
    assert slurm_duration("1-02:03:04") == 93784.0
