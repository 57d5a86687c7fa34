"""Numbers, times and run states as a report shows them: the formatting half of rendering.

Reports render numbers, they never compute them; this module is where "how a number reads"
lives for every page (HTML report, diff page). Numbers, milliseconds, SI prefixes and
percentages come from the one formatter of the code base, ``gpudiag.units`` (re-exported here
for the pages), so a time or a rate reads the same in a verdict written by the analyzers, in the
terminal and here.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

from gpudiag.diagnosis import RunSummary
from gpudiag.units import ms, num, pct, si

__all__ = ["evidence_value", "gbps", "ms", "num", "pct", "run_status", "si", "si_text", "signed_ms", "when"]


def gbps(v: float | None) -> str:
    """A bandwidth given in GB/s, with the prefix its size calls for (``units.si``)."""
    return "n/a" if v is None or v != v else si(v * 1e9, "B/s")


def signed_ms(us: float | None) -> str:
    """'+1.2 ms', '-0.5 ms', '0 ms': a change."""
    if us is None or us != us:
        return "n/a"
    return ("+" if us > 0 else "") + ms(us)


_PREFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_RATE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?) ?([kMGTP]?)(FLOP/s|B/s)(?![\w/])")


def si_text(text: str) -> str:
    """Rates in analyzer prose ('0.06718 TFLOP/s', '1550 GB/s') re-written with the prefix the
    report uses everywhere (``units.si``: '67.2 GFLOP/s', '1.55 TB/s'). Only the formatting
    changes; the value is the same."""
    return _RATE.sub(lambda m: si(float(m.group(1)) * _PREFIX[m.group(2)], m.group(3)), text)


def when(ts: float | None) -> str:
    if not ts:
        return "n/a"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def evidence_value(key: str, v: float) -> str:
    """Evidence values are shares (0..1) unless their key names a unit."""
    if key.endswith("share") or key == "mfu":
        return pct(v)
    return num(v)


def run_status(r: RunSummary) -> str:
    """'killed by SIGKILL at step 12', 'failed with exit code 3 at step 7', ..."""
    at = f" at step {r.last_step}" if r.last_step else ""
    if r.signal:
        return f"{r.status} by {r.signal}{at}"
    if r.status == "completed":
        return f"completed (exit code {r.exit_code})" + (f", last step {r.last_step}" if r.last_step else "")
    if r.status == "failed" and r.exit_code is not None:
        return f"failed with exit code {r.exit_code}{at}"
    return f"{r.status}{at}"

