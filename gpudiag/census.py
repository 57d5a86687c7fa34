"""The host-sync census a job's bootstrap writes (``samples/syncs-rank-N.json``), as data.

``collectors/torch_syncs.py`` writes it; ``gpudiag.rundir.read_syncs`` reads the files and this
module turns each into a ``SyncCensus``, bounding what a job's own file may claim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeGuard


def is_number(v: Any) -> TypeGuard[float]:  # a JSON value
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
    seconds: float  # inside these calls in that step (wall)
    cpu_seconds: float  # the same, the training thread's CPU time (no time the OS ran others)
    # inside an nn.Module call (a forward's read-back); None: a census written before it was read
    in_module: bool | None = None


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
    feeding_cpu_s: float = 0.0
    # (op, calls, wall s, CPU s) of the busiest operators among them
    feeding_top: list[tuple[str, int, float, float]] = field(default_factory=list)
    # the job's Python right after the syncs and their feeding operators, up to the next torch
    # call: what the loop does with the values read back (``collectors.torch_syncs``)
    after_s: float = 0.0
    after_cpu_s: float = 0.0
    torch_calls: int = 0
    # the census step's wall time (s): the mode it runs in slows every torch call; None: not read
    wall_s: float | None = None
    dropped_sites: int = 0
    skipped: str | None = None
    note: str | None = None


# the end of a site's function where the sync was torch.optim's own (``collectors.torch_syncs``
# writes it): counted, shown, never the job's to remove
OPTIM_MARK = " in torch.optim"
MAX_CENSUS_SITES = 1000  # sites read from one file (the bootstrap keeps at most 200)


def parse_census(data: Any, cwd: str | None) -> SyncCensus | None:  # parsed JSON
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
        wall = max(0.0, float(r["seconds"]))
        inside = r.get("in_module")
        sites.append(CensusSite(path, int(r.get("line") or 0), str(r.get("function", ""))[:200],
                                str(r.get("kind", "?"))[:100], max(0, r["calls"]), wall,
                                _cpu(r, wall), inside if isinstance(inside, bool) else None))
    raw_feed = data.get("feeding")
    feed: dict[str, Any] = raw_feed if isinstance(raw_feed, dict) else {}
    top = [(str(t.get("op", "?"))[:100], int(t.get("calls", 0)), float(t["seconds"]),
            _cpu(t, float(t["seconds"])))
           for t in (feed.get("top") or [])[:20] if isinstance(t, dict) and is_number(t.get("seconds"))]
    feed_wall = max(0.0, float(feed["seconds"])) if is_number(feed.get("seconds")) else 0.0
    after_wall = max(0.0, float(feed["after_seconds"])) if is_number(feed.get("after_seconds")) else 0.0
    after_cpu: Any = feed.get("after_cpu_seconds")
    step = data.get("step")
    return SyncCensus(
        rank=data["rank"], step=step if isinstance(step, int) else None,
        device=str(data.get("device", "cpu")), sites=sites,
        feeding_ops=int(feed.get("ops", 0)) if isinstance(feed.get("ops"), int) else 0,
        feeding_s=feed_wall, feeding_cpu_s=_cpu(feed, feed_wall),
        feeding_top=top, after_s=after_wall,
        after_cpu_s=min(after_wall, max(0.0, float(after_cpu))) if is_number(after_cpu) else 0.0,
        torch_calls=int(data.get("torch_calls") or 0),
        wall_s=float(data["wall_s"]) if is_number(data.get("wall_s")) and data["wall_s"] > 0 else None,
        dropped_sites=int(data.get("dropped_sites") or 0),
        note=str(data["note"])[:500] if isinstance(data.get("note"), str) else None)


def _cpu(row: dict[str, Any], wall: float) -> float:
    """A row's CPU seconds, never above its wall time (a file without them: the wall time)."""
    v: Any = row.get("cpu_seconds")
    return min(wall, max(0.0, float(v))) if is_number(v) else wall
