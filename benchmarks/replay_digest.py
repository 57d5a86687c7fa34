"""A digest of every decision of a replay: for checking that a speed-up changed none.

Usage:
    python benchmarks/replay_digest.py [--trace ../shared/clusters/philly.csv] [--limit 20000]
        [--nodes 80] [--seed 0] [--policies easy,gpudiag] [--out digest.json]

For each policy it prints the replay's CPU time and one SHA-256 over every start (job, time,
nodes and GPU indices), every job's first start, end, run segments, preemptions, lost and
slowed-down GPU-seconds, learned MFU, and the summary metrics (``metrics.summarise`` less its
wall time), all with full float precision. Run it before and after a change: the digests must be
equal (``--out`` keeps the records themselves, to find where two runs part).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from gpudiag.scheduler.model import Cluster, Policy
from gpudiag.scheduler.sim import simulator as sim
from gpudiag.scheduler.sim.metrics import summarise
from gpudiag.scheduler.sim.mfu_model import synthesise
from gpudiag.scheduler.sim.traces import read_trace

REPO = Path(__file__).resolve().parents[1]
POLICIES = {"easy": Policy.easy, "fifo": Policy.fifo, "gpudiag": Policy}


def record(jobs, mfu, cluster, policy: Policy) -> tuple[dict, float]:
    """(every decision and metric of one replay, its CPU seconds)."""
    starts: list[list[str]] = []
    start = sim.Replay.start

    def noting(self, s, placement, now):   # the replay's own start, each one written down
        starts.append([repr(s.job.id), repr(now), repr(placement.slots)])
        return start(self, s, placement, now)

    sim.Replay.start = noting
    try:
        cpu = time.process_time()
        res = sim.simulate(jobs, mfu, cluster, policy)
        cpu = time.process_time() - cpu
    finally:
        sim.Replay.start = start
    m = summarise(res)
    m.pop("sim_wall_s")
    per = [[s.trace_id, repr(s.first_start), repr(s.end), [[repr(x) for x in seg] for seg in s.segments],
            s.preemptions, repr(s.lost_gpu_s), repr(s.slow_gpu_s), s.learned, repr(s.seen_mfu),
            repr(s.rack_cost_gpu_s)] for s in res.jobs]
    return {"metrics": json.loads(json.dumps(m, default=repr)), "jobs": per, "starts": starts,
            "aging": res.aging_violations, "rejected": res.rejected}, cpu


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(REPO.parent / "shared" / "clusters" / "philly.csv"))
    ap.add_argument("--limit", type=int, default=20000, help="the first N jobs (0: all)")
    ap.add_argument("--nodes", type=int, default=80)
    ap.add_argument("--rack-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default="easy,gpudiag")
    ap.add_argument("--out", help="write the records as JSON")
    a = ap.parse_args()
    tr = read_trace(a.trace)
    jobs = tr.jobs[: a.limit] if a.limit else tr.jobs
    mfu = synthesise(jobs, a.seed)
    cluster = Cluster.uniform(a.nodes, 8, a.rack_size)
    out = {}
    for name in a.policies.split(","):
        rec, cpu = record(jobs, mfu, cluster, POLICIES[name]())
        digest = hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()[:16]
        print(f"{name}: {len(jobs)} jobs, {a.nodes} nodes, seed {a.seed}: {len(rec['starts'])} starts, "
              f"CPU {cpu:.2f} s, digest {digest}", flush=True)
        out[name] = rec
    if a.out:
        Path(a.out).write_text(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
