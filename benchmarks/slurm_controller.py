"""One Slurm controller round at scale: 5,000 pending + 2,000 running jobs (target < 2 s).

Slurm's side is replayed: an ``squeue --json`` document in Slurm 22.05's v0.0.38 shape (the
fields ``tests/test_slurm.py`` reads from a real slurmctld), ``sinfo`` for 1,000 nodes of 8
GPUs, partitions and config as ``scontrol`` prints them; the changes the round makes are
counted instead of run. Prometheus' side is a real HTTP server answering ``/api/v1/query``
with recorded vectors for every running job (and the requeued pending ones). Everything else
- parsing, the signal source, the policy core, the ledger - is the code the controller runs.
Prints the round times and the scontrol calls per changed job (target: at most one).

    python benchmarks/slurm_controller.py [--pending 5000] [--running 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from gpudiag.scheduler.slurm.controller import Controller, Options
from gpudiag.scheduler.slurm.slurmio import SlurmIO
from gpudiag.scheduler.slurm.sources import QUERIES, PrometheusSource

NODES, GPUS_PER_NODE = 1000, 8   # 8,000 GPUs: room for 2,000 running jobs of 1-4 GPUs
PARTITIONS = "\n".join(
    f"PartitionName={n} Nodes=n[0000-0999] PriorityTier={t} PreemptMode={m} GraceTime=60 State=UP"
    for n, t, m in (("spot", 1, "REQUEUE"), ("reserved", 2, "REQUEUE"), ("ondemand", 3, "OFF")))
CONFIG = "KillWait = 30 sec\nPreemptExemptTime = 00:00:00\nPriorityType = priority/basic\n"


def squeue_doc(pending: int, running: int, rng: random.Random, now: float) -> dict:
    jobs = []
    free = {n: list(range(GPUS_PER_NODE)) for n in range(NODES)}
    node = 0
    for i in range(running):
        g = rng.choice((1, 2, 2, 4))
        while len(free[node % NODES]) < g:
            node += 1
        n = node % NODES
        idx, free[n] = free[n][:g], free[n][g:]
        jobs.append(_job(i + 1, "RUNNING", rng, now, g, f"n{n:04d}", f"gpu:{g}(IDX:{idx[0]}-{idx[-1]})"))
    for i in range(pending):
        jobs.append(_job(running + i + 1, "PENDING", rng, now, rng.choice((1, 2, 4, 8)), "", None))
    return {"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [], "jobs": jobs}


def _uid(jid: int) -> int:
    """The uid of a job's user (user_name u<N> is uid 1000+N): its agent series carry it as owner_uid."""
    return 1000 + jid % 40


def _job(jid: int, state: str, rng: random.Random, now: float, gpus: int, nodes: str,
         detail: str | None) -> dict:
    return {"job_id": jid, "name": f"key{jid % 300}", "user_name": f"u{jid % 40}", "user_id": _uid(jid),
            "account": f"t{jid % 8}",
            "partition": rng.choice(("spot", "reserved", "reserved", "ondemand")), "job_state": state,
            "state_reason": "None" if state == "RUNNING" else rng.choice(("Priority", "Resources")),
            "nice": None, "priority": 4294900000 - jid, "submit_time": int(now - rng.uniform(60, 86400)),
            "start_time": int(now - rng.uniform(600, 40000)) if state == "RUNNING" else 0,
            "time_limit": rng.choice((None, 240, 1440)), "tres_per_node": f"gres:gpu:{gpus}",
            "node_count": 1, "nodes": nodes, "gres_detail": [detail] if detail else []}


class ReplayIO(SlurmIO):
    """Recorded Slurm output through the real parsers; writes are counted, not run."""

    def __init__(self, squeue: str) -> None:
        super().__init__()
        self.squeue = squeue
        self.writes: Counter = Counter()

    def _run(self, *argv: str) -> str:
        self.calls += 1
        if argv[0] == "squeue":
            return self.squeue
        if argv[0] == "sinfo":
            return "".join(f"n{i:04d}|gpu:{GPUS_PER_NODE}\n" for i in range(NODES))
        if argv[:3] == ("scontrol", "show", "partition"):
            return PARTITIONS
        if argv[:3] == ("scontrol", "show", "config"):
            return CONFIG
        self.writes[argv[2] if argv[1] == "update" else f"JobId={argv[2]}"] += 1
        return ""


def prometheus_answers(doc: dict, rng: random.Random) -> dict[str, bytes]:
    running = [j["job_id"] for j in doc["jobs"] if j["job_state"] == "RUNNING"]
    now = time.time()

    def vec(metric: str, value) -> list:
        return [{"metric": {"__name__": metric, "job_id": f"slurm:{j}", "owner_uid": str(_uid(j)),
                            "instance": "n:9835"},
                 "value": [now, str(value(j))]} for j in running]
    labels = {j: rng.choice(("compute-bound", "input-bound", "memory-bound")) for j in running}
    out = {
        "mfu": vec("gpudiag_job_mfu_ratio", lambda j: round(rng.uniform(0.02, 0.6), 3)),
        "confidence": vec("gpudiag_job_signal_confidence", lambda j: 0.9),
        "seen": vec("gpudiag_job_last_signal_timestamp_seconds", lambda j: round(now - 30, 3)),
        "label": [{"metric": {"job_id": f"slurm:{j}", "owner_uid": str(_uid(j)), "instance": "n:9835",
                              "label": labels[j]},
                   "value": [now, "1"]} for j in running],
    }
    return {QUERIES[k]: json.dumps({"status": "success",
                                    "data": {"resultType": "vector", "result": v}}).encode()
            for k, v in out.items()}


def serve_prometheus(answers: dict[str, bytes]) -> ThreadingHTTPServer:
    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            q = parse_qs(urlparse(self.path).query).get("query", [""])[0]
            body = answers.get(q, b'{"status":"success","data":{"resultType":"vector","result":[]}}')
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pending", type=int, default=5000)
    ap.add_argument("--running", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(12)
    now = time.time()
    doc = squeue_doc(args.pending, args.running, rng, now)
    raw = json.dumps(doc)
    srv = serve_prometheus(prometheus_answers(doc, rng))
    io = ReplayIO(raw)
    with tempfile.TemporaryDirectory() as d:
        ctl = Controller(io, PrometheusSource(f"http://127.0.0.1:{srv.server_address[1]}"),
                         options=Options(min_change_interval_s=0), ledger_path=Path(d) / "ledger.json")
        times, per_job_max, changed = [], 0, 0
        for _ in range(args.rounds):
            io.writes.clear()
            t = time.perf_counter()
            res = ctl.round(time.time())
            times.append(time.perf_counter() - t)
            per_job_max = max([per_job_max, *io.writes.values()])
            changed += sum(1 for a in res.actions if a.applied)
    srv.shutdown()
    print(f"squeue --json: {len(raw) / 1e6:.1f} MB, {args.pending} pending + {args.running} running, "
          f"{NODES} nodes x {GPUS_PER_NODE} GPUs")
    print(f"round: median {statistics.median(times):.3f} s, max {max(times):.3f} s over {args.rounds} rounds "
          f"(target < 2 s): {'ok' if max(times) < 2 else 'OVER'}")
    print(f"changes applied: {changed}; most scontrol calls for one job or partition in one round: "
          f"{per_job_max} (target <= 1)")


if __name__ == "__main__":
    main()
