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
