"""A job of many ranks built from the real sampled 128-rank trace (ranks 0 and 1 of it).

``../shared/traces/a100-sampled-128rank`` holds two of the job's 128 rank files; the other
ranks are those two again, each renumbered, and chosen ranks slowed down (every timestamp
and duration scaled), so the job has known stragglers at known ranks.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tests.conftest import TRACES

SOURCE = TRACES / "a100-sampled-128rank"


def make_job(out: Path, world: int = 128, slow: dict[int, float] | None = None) -> Path:
    """``world`` rank files in ``out`` (rank r copies source rank r % 2); ``slow`` maps a rank
    to the factor its times are stretched by."""
    slow = slow or {}
    out.mkdir(parents=True, exist_ok=True)
    docs = [json.loads(gzip.decompress((SOURCE / f"rank-{i}.json.gz").read_bytes())) for i in (0, 1)]
    for r in range(world):
        doc = dict(docs[r % 2])
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r, "world_size": world}
        k = slow.get(r, 1.0)
        if k != 1.0:
            t0 = min(e["ts"] for e in doc["traceEvents"] if isinstance(e.get("ts"), (int, float)))
            doc["traceEvents"] = [_stretch(e, t0, k) for e in doc["traceEvents"]]
        (out / f"rank-{r}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    return out


def _stretch(e: dict, t0: float, k: float) -> dict:
    e = dict(e)
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = t0 + (e["ts"] - t0) * k
    if isinstance(e.get("dur"), (int, float)):
        e["dur"] = e["dur"] * k
    return e
