"""The one formatter's durations read as a person writes them."""

from __future__ import annotations

from gpudiag.units import ms, us


def test_a_call_of_milliseconds_is_said_in_milliseconds_not_as_an_exponent():
    """Seen in the compile prediction's text: "2.29e+03 us a call" (the third blind zoo)."""
    assert us(2290.0) == "2.29 ms"
    assert us(12.34) == "12.3 us"
    assert us(0.5) == "0.5 us"
    assert us(None) == "n/a" and us(float("nan")) == "n/a"
    assert ms(78940.0) == "78.9 ms" and ms(4.3359e7) == "43,359 ms"


def test_a_tiny_percentage_keeps_two_significant_digits_so_two_small_mfus_stay_apart():
    from gpudiag.units import pct_fine

    assert pct_fine(0.000021) == "0.0021%" and pct_fine(0.00005) == "0.005%"
    assert pct_fine(0.209) == "20.9%" and pct_fine(0.0) == "0.0%" and pct_fine(None) == "n/a"
