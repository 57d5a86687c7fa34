"""The host-sync census a job's bootstrap writes (``samples/syncs-rank-N.json``), as data.

``collectors/torch_syncs.py`` writes it; ``gpudiag.rundir.read_syncs`` reads the files and this
module turns each into a ``SyncCensus``, bounding what a job's own file may claim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def is_number(v: Any) -> bool:  # noqa: ANN401 - a JSON value
    """A JSON number that is one (not a bool, not NaN): the run directory's readers share it."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


@dataclass
class CensusSite:
    """One call site of the sync census (samples/syncs-rank-N.json): where, what, how often."""

    file: str
    line: int
    function: str
    kind: str
    calls: int  # in the census step
    seconds: float  # inside these calls in that step


@dataclass
class SyncCensus:
    """samples/syncs-rank-N.json: the host syncs the bootstrap saw in one step of one rank
    (``collectors.torch_syncs``), or why it took none (``skipped``)."""

    rank: int
    step: int | None = None
    device: str = "cpu"
    sites: list[CensusSite] = field(default_factory=list)
    feeding_ops: int = 0  # operators whose results fed only syncs
    feeding_s: float = 0.0
    feeding_top: list[tuple[str, int, float]] = field(default_factory=list)  # (op, calls, s)
    torch_calls: int = 0
    dropped_sites: int = 0
    skipped: str | None = None
    note: str | None = None


MAX_CENSUS_SITES = 1000  # sites read from one file (the bootstrap keeps at most 200)


def parse_census(data: Any, cwd: str | None) -> SyncCensus | None:  # noqa: ANN401 - parsed JSON
    """A census from its parsed JSON (None: not one); values bounded and typed, as a job's own
    file is a claim."""
    if not isinstance(data, dict) or not isinstance(data.get("rank"), int):
        return None
    if isinstance(data.get("skipped"), str):
        return SyncCensus(rank=data["rank"], skipped=data["skipped"][:500])
    sites = []
    for r in (data.get("sites") or [])[:MAX_CENSUS_SITES]:
        if not isinstance(r, dict) or not is_number(r.get("seconds")) or not isinstance(r.get("calls"), int):
            continue
        path = str(r.get("file", "?"))
        if cwd and path.startswith(cwd.rstrip("/") + "/"):
            path = path[len(cwd.rstrip("/")) + 1:]
        sites.append(CensusSite(path, int(r.get("line") or 0), str(r.get("function", ""))[:200],
                                str(r.get("kind", "?"))[:100], max(0, r["calls"]),
                                max(0.0, float(r["seconds"]))))
    feed = data.get("feeding") if isinstance(data.get("feeding"), dict) else {}
    top = [(str(t.get("op", "?"))[:100], int(t.get("calls", 0)), float(t.get("seconds", 0.0)))
           for t in (feed.get("top") or [])[:20] if isinstance(t, dict) and is_number(t.get("seconds"))]
    step = data.get("step")
    return SyncCensus(
        rank=data["rank"], step=step if isinstance(step, int) else None,
        device=str(data.get("device", "cpu")), sites=sites,
        feeding_ops=int(feed.get("ops", 0)) if isinstance(feed.get("ops"), int) else 0,
        feeding_s=max(0.0, float(feed["seconds"])) if is_number(feed.get("seconds")) else 0.0,
        feeding_top=top, torch_calls=int(data.get("torch_calls") or 0),
        dropped_sites=int(data.get("dropped_sites") or 0),
        note=str(data["note"])[:500] if isinstance(data.get("note"), str) else None)
