"""One Slurm controller round at scale: 5,000 pending + 2,000 running jobs (target < 2 s); and
with ``--real``, rounds with 200 Nice writes against a real slurmctld, as a ratio to a round
without writes (target: the round with writes < 2 s).

Replayed (the default): Slurm's side is an ``squeue --json`` document in Slurm 22.05's v0.0.38
shape (the fields ``tests/system/slurm/test_slurm.py`` reads from a real slurmctld), ``scontrol show node``
for 1,000 nodes (600 of 8 GPUs, 400 of 4), partitions and config as ``scontrol`` prints them; the
changes the round makes are counted instead of run. Prometheus' side is a real HTTP server
answering ``/api/v1/query`` with recorded vectors for every running job. Everything else -
parsing, the signal source, the policy core, the write-ahead ledger (a real file, fsynced) - is
the code the controller runs. Prints the round times, the squeue reads per round (target: one,
plus one before each PreemptMode or requeue write and one after a round's takes: ``fresh``), the
scontrol calls per changed job (target: at most one) and the ledger writes per round.

``--real``: a real munged, slurmctld and slurmd (``tests/slurm_cluster.py``: one node, 4 GPUs),
``--pending`` jobs waiting behind a full node, each with a replayed signal. Rounds alternate: no
writes, 200 Nice writes batched (one ``scontrol update JobId=a,b,c Nice=V`` per value, four calls
at a time), no writes, 200 Nice writes one ``scontrol`` per job in a row (how the controller wrote
before issue 41), each write round's Nice put back before the next round (the partitions stay
held, as in a steady state). Prints each kind's median and its ratio to the rounds without
writes measured in the same run, and the scontrol calls of each.

    python benchmarks/slurm_controller.py [--pending 5000] [--running 2000] [--rounds 5]
    python benchmarks/slurm_controller.py --real [--pending 500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from gpudiag.scheduler.slurm.actions import restore
from gpudiag.scheduler.slurm.controller import Controller, Options
from gpudiag.scheduler.slurm.slurmio import RELOAD_MARK, SlurmIO
from gpudiag.scheduler.slurm.sources import QUERIES, PrometheusSource

NODES, GPUS_PER_NODE = 1000, 8   # 600 x 8 + 400 x 4 = 6,400 GPUs: room for 2,000 running jobs of 1-4
SMALL_FROM = 600                 # nodes from this index have 4 GPUs
PARTITIONS = "\n".join(
    f"PartitionName={n} Nodes=n[0000-0999] PriorityTier={t} PreemptMode={m} GraceTime=60 State=UP"
    for n, t, m in (("spot", 1, "REQUEUE"), ("reserved", 2, "REQUEUE"), ("ondemand", 3, "OFF")))
CONFIG = ("KillWait = 30 sec\nPreemptExemptTime = 00:00:00\nPriorityType = priority/basic\n"
          "PreemptType = preempt/partition_prio\nClusterName = bench\nSlurmctldHost[0] = ctl(10.0.0.1)\n"
          "StateSaveLocation = {state}\nSelectTypeParameters = CR_CORE\nBOOT_TIME = 2026-11-28T00:00:00\n")


def size(n: int) -> int:
    return GPUS_PER_NODE if n < SMALL_FROM else 4


def squeue_doc(pending: int, running: int, rng: random.Random, now: float) -> dict:
    jobs = []
    free = {n: list(range(size(n))) for n in range(NODES)}
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
            "node_count": 1, "nodes": nodes, "gres_detail": [detail] if detail else [],
            "requeue": True, "preempt_time": 0, "restart_cnt": 0,
            "tres_alloc_str" if state == "RUNNING" else "tres_req_str": f"cpu={gpus},node=1"}


class ReplayIO(SlurmIO):
    """Recorded Slurm output through the real parsers; writes are counted, not run."""

    def __init__(self, squeue: str, nodes: str, state: str) -> None:
        super().__init__()
        self.squeue, self.node_text, self.state = squeue, nodes, state
        self.writes: Counter = Counter()
        self.reads: Counter = Counter()
        self.modes = {"spot": "REQUEUE", "reserved": "REQUEUE", "ondemand": "OFF"}
        self.mark = False

    def _spawn(self, argv):  # SlurmIO's
        out = subprocess.CompletedProcess(list(argv), 0, self._answer(*argv), "")
        self.calls += 1
        return out

    def _answer(self, *argv: str) -> str:
        self.reads[" ".join(argv[:3])] += 1
        if argv[0] == "squeue":
            return self.squeue
        if argv[:3] == ("scontrol", "show", "node"):
            return self.node_text
        if argv[:4] == ("scontrol", "-a", "show", "partition"):
            first = (("spot", "REQUEUE"), ("reserved", "REQUEUE"), ("ondemand", "OFF"))
            mark = f"\nPartitionName={RELOAD_MARK} PriorityTier=0 State=INACTIVE" if self.mark else ""
            return "\n".join(line.replace(f"PreemptMode={m0}", f"PreemptMode={self.modes[n]}")
                             for line, (n, m0) in zip(PARTITIONS.splitlines(), first, strict=True)) + mark
        if argv[:3] == ("scontrol", "show", "config"):
            return CONFIG.format(state=self.state)
        if argv[:3] == ("scontrol", "show", "job"):
            return f"JobId={argv[-1]} JobState=PENDING"
        if argv[:2] == ("scontrol", "create"):
            self.mark = True
            return ""
        if argv[2].startswith("PartitionName="):
            self.writes[argv[2]] += 1
            self.modes[argv[2].split("=", 1)[1]] = argv[3].split("=", 1)[1]
        elif argv[2].startswith("JobId="):        # one call for a list of jobs: counted per job
            for jid in argv[2].split("=", 1)[1].split(","):
                self.writes[f"JobId={jid}"] += 1
        else:                                     # scontrol requeue N
            self.writes[f"JobId={argv[2]}"] += 1
        return ""


def node_text(doc: dict) -> str:
    """``scontrol show node -o`` for the replayed cluster, CPUs allocated as the jobs hold them."""
    alloc = Counter()
    for j in doc["jobs"]:
        if j["job_state"] == "RUNNING":
            alloc[j["nodes"]] += int(j["tres_alloc_str"].split(",")[0].split("=")[1])
    return "".join(f"NodeName=n{i:04d} Gres=gpu:{size(i)} CPUTot=64 CPUAlloc={alloc[f'n{i:04d}']} "
                   f"RealMemory=512000 AllocMem=0 State=MIXED\n" for i in range(NODES))


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
        def do_GET(self) -> None:  # http.server's name
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
    ap.add_argument("--pending", type=int, default=None, help="5000 replayed, 500 with --real")
    ap.add_argument("--running", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=None,
                    help="5 replayed; with --real, the rounds of each kind (3)")
    ap.add_argument("--real", action="store_true",
                    help="rounds with 200 Nice writes against a real slurmctld")
    args = ap.parse_args()
    if args.real:
        real(args.pending or 500, args.rounds or 3)
        return
    replay(args.pending or 5000, args.running, args.rounds or 5)


def replay(pending: int, running: int, rounds: int) -> None:
    rng = random.Random(12)
    now = time.time()
    doc = squeue_doc(pending, running, rng, now)
    raw = json.dumps(doc)
    srv = serve_prometheus(prometheus_answers(doc, rng))
    with tempfile.TemporaryDirectory() as d:
        io = ReplayIO(raw, node_text(doc), d)
        ctl = Controller(io, PrometheusSource(f"http://127.0.0.1:{srv.server_address[1]}"),
                         options=Options(min_change_interval_s=0, lease_s=180.0),
                         ledger_path=Path(d) / "ledger.json")
        times, cpu, per_job_max, changed, squeues, ledger_writes, requeues = [], [], 0, 0, 0, 0, 0
        extra = 0     # squeue reads beyond the round's own one: the fresh view of its writes
        for _ in range(rounds):
            io.writes.clear()
            io.reads.clear()
            before = ctl.store.writes
            t, c = time.perf_counter(), time.process_time()
            res = ctl.round(time.time())
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            per_job_max = max([per_job_max, *io.writes.values()])
            changed += sum(1 for a in res.actions if a.applied)
            requeues += sum(1 for a in res.actions if a.applied and a.kind == "requeue")
            squeues = max(squeues, io.reads["squeue --json"])
            writes = sum(1 for a in res.actions if a.kind in ("preempt_mode", "requeue"))
            takes = any(a.kind == "preempt_mode" and a.applied and a.new == "OFF" for a in res.actions)
            extra = max(extra, io.reads["squeue --json"] - 1 - writes - takes)
            ledger_writes = max(ledger_writes, ctl.store.writes - before)
    srv.shutdown()
    print(f"squeue --json: {len(raw) / 1e6:.1f} MB, {pending} pending + {running} running, "
          f"{SMALL_FROM} nodes x {GPUS_PER_NODE} GPUs + {NODES - SMALL_FROM} x 4")
    print(f"round: median {statistics.median(times):.3f} s, max {max(times):.3f} s over {rounds} rounds "
          f"(target < 2 s): {'ok' if max(times) < 2 else 'OVER'}; CPU time per round: median "
          f"{statistics.median(cpu):.3f} s (the load-robust number on a shared machine)")
    print(f"requeues: {requeues} over the rounds; partitions held: {', '.join(res.held) or 'none'}")
    print(f"changes applied: {changed}; most scontrol calls for one job or partition in one round: "
          f"{per_job_max} (target <= 1); squeue reads per round: {squeues} (target 1 + one per PreemptMode "
          f"or requeue write + one after takes: {'ok' if extra <= 0 else 'OVER'}); "
          f"ledger writes per round: at most {ledger_writes}")


# Slurm runs a scheduling pass after job updates (sched_interval 2 s in the test cluster): a round
# read right after 200 Nice writes waits for it. The controller's rounds are --interval (60 s)
# apart, so each measured round starts with slurmctld idle.
SETTLE_S = 3.0


class OnePerJobIO(SlurmIO):
    """Nice written one ``scontrol`` per job, as the controller did before issue 41 (``batch``
    False), or batched (True); every command counted."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(env=env)
        self.batch = True
        self.nice_calls = 0

    def set_nice_many(self, job_ids, nice):  # SlurmIO's
        if self.batch:
            self.nice_calls += -(-len(job_ids) // 500)
            return super().set_nice_many(job_ids, nice)
        for jid in job_ids:
            self.nice_calls += 1
            self.set_nice(jid, nice)
        return {}


def real(pending: int, rounds: int) -> None:
    """Rounds with and without 200 Nice writes against a real slurmctld, batched and one per job."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from concurrent.futures import ThreadPoolExecutor

    from tests.slurm_cluster import SlurmCluster

    with tempfile.TemporaryDirectory(prefix="gpudiag-bench-") as d:
        cluster = SlurmCluster(Path(d) / "slurm")
        (Path(d) / "slurm").mkdir()
        cluster.start()
        try:
            blockers = [cluster.sbatch("blocker", "reserved", 3), cluster.sbatch("one", "reserved", 1)]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(8) as pool:
                waiting = list(pool.map(lambda i: cluster.sbatch(f"w{i % 50}", "reserved", 1),
                                        range(pending)))
            print(f"{pending} jobs submitted in {time.perf_counter() - t0:.0f} s behind {len(blockers)} "
                  "running")
            rng = random.Random(12)
            mfu = {j: 0.4 for j in blockers} | {j: round(rng.uniform(0.01, 0.39), 3) for j in waiting}
            srv = serve_prometheus(real_answers(mfu))
            io = OnePerJobIO(cluster.env)
            ctl = Controller(io, PrometheusSource(f"http://127.0.0.1:{srv.server_address[1]}"),
                             options=Options(min_change_interval_s=0, lease_s=180.0),
                             ledger_path=Path(d) / "ledger.json")
            ctl.opt.max_changes = 0
            ctl.round(time.time())          # takes the partitions, makes the reload mark: not measured
            times: dict[str, list[float]] = {"no writes": [], "200 writes, batched": [],
                                             "200 writes, one scontrol per job": []}
            calls: dict[str, list[int]] = {k: [] for k in times}
            order = ("no writes", "200 writes, batched", "no writes", "200 writes, one scontrol per job")
            for _ in range(rounds):
                for kind in order:
                    ctl.opt.max_changes = 0 if kind == "no writes" else 200
                    io.batch = kind != "200 writes, one scontrol per job"
                    io.nice_calls = 0
                    time.sleep(SETTLE_S)     # slurmctld's own pass after the last writes is not this round's
                    t = time.perf_counter()
                    res = ctl.round(time.time())
                    times[kind].append(time.perf_counter() - t)
                    calls[kind].append(io.nice_calls)
                    done = sum(a.applied for a in res.actions if a.kind == "nice")
                    assert done == ctl.opt.max_changes, (kind, done)
                    assert not [a for a in res.actions if a.kind != "nice"], res.actions   # Nice only
                    if done:                         # every Nice back (the partitions stay held):
                        with ctl.store.update() as ledger:   # the next write round has 200 to do
                            back = sorted(ledger.nice)
                            ledger.nice.clear()
                        io.batch = True
                        io.set_nice_many(back, 0)
            restore(io, ctl.store)
            srv.shutdown()
            base = statistics.median(times["no writes"])
            print(f"round, {pending} pending, real slurmctld (medians; load average "
                  f"{os.getloadavg()[0]:.1f} at the end):")
            for kind, ts in times.items():
                print(f"  {kind:34s} {statistics.median(ts):.3f} s (max {max(ts):.3f}), "
                      f"{statistics.median(ts) / base:.2f}x the round without writes; Nice scontrol calls "
                      f"{statistics.median(calls[kind]):.0f}")
            worst = max(times["200 writes, batched"])
            print(f"target: a round with 200 writes < 2 s: {'ok' if worst < 2 else 'OVER'} ({worst:.3f} s)")
        finally:
            cluster.stop()


def real_answers(mfu: dict[int, float]) -> dict[str, bytes]:
    """Prometheus' answers for the real cluster's jobs (run by root: owner_uid 0)."""
    now = time.time()

    def vec(metric: str, value) -> list:
        return [{"metric": {"__name__": metric, "job_id": f"slurm:{j}", "owner_uid": "0",
                            "instance": "n:9835"}, "value": [now, str(value(j))]} for j in mfu]
    out = {"mfu": vec("gpudiag_job_mfu_ratio", lambda j: mfu[j]),
           "confidence": vec("gpudiag_job_signal_confidence", lambda j: 0.9),
           "seen": vec("gpudiag_job_last_signal_timestamp_seconds", lambda j: round(now, 3)),
           "label": [{"metric": {"job_id": f"slurm:{j}", "owner_uid": "0", "instance": "n:9835",
                                 "label": "compute-bound"}, "value": [now, "1"]} for j in mfu]}
    return {QUERIES[k]: json.dumps({"status": "success", "data": {"resultType": "vector",
                                                                  "result": v}}).encode()
            for k, v in out.items()}


if __name__ == "__main__":
    main()
