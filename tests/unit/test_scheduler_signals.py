"""Every runtime reads the agent's series with one meaning of a signal's age (time since the
agent last heard from the job: a ``--monitor`` job re-traces every 10 minutes, so the age of its
trace passes the policy's 300 s staleness limit while it still reports every 15 s), and with one
identity: (job id, the uid that wrote the signal), attributed only to a job of that uid."""

from __future__ import annotations

import json
import math

from gpudiag.scheduler.model import Policy
from gpudiag.scheduler.priority import MfuBook, signal_usable
from gpudiag.scheduler.signals import SignalRead, parse_metrics
from gpudiag.scheduler.slurm.sources import QUERIES, parse_prometheus_answers, slurm_signals
from gpudiag.scheduler.slurm.squeue import SlurmJob, parse_squeue_fixed, parse_squeue_json

NOW = 1_800_000_000.0
ALICE, MALLORY = 1001, 1002
# what an agent exports when alice's Slurm job 7 reports and mallory names it too
EXPOSITION = f"""# TYPE gpudiag_job_mfu_ratio gauge
gpudiag_job_mfu_ratio{{job_id="slurm:7",owner_uid="{ALICE}"}} 0.31
gpudiag_job_mfu_ratio{{job_id="slurm:7",owner_uid="{MALLORY}"}} 0.001
gpudiag_job_mfu_ratio{{job_id="local:1",owner_uid="0"}} 0.2
# TYPE gpudiag_job_bottleneck gauge
gpudiag_job_bottleneck{{job_id="slurm:7",label="memory-bound",owner_uid="{ALICE}"}} 1.0
gpudiag_job_bottleneck{{job_id="slurm:7",label="host-bound",owner_uid="{ALICE}"}} 0.0
gpudiag_job_bottleneck{{job_id="slurm:7",label="input-bound",owner_uid="{MALLORY}"}} 1.0
# TYPE gpudiag_job_signal_confidence gauge
gpudiag_job_signal_confidence{{job_id="slurm:7",owner_uid="{ALICE}"}} 0.8
gpudiag_job_signal_confidence{{job_id="slurm:7",owner_uid="{MALLORY}"}} 1.0
# TYPE gpudiag_job_mfu_confidence gauge
gpudiag_job_mfu_confidence{{job_id="slurm:7",owner_uid="{ALICE}"}} 0.9
# TYPE gpudiag_job_signal_age_seconds gauge
gpudiag_job_signal_age_seconds{{job_id="slurm:7",owner_uid="{ALICE}"}} 540.0
# TYPE gpudiag_job_last_signal_timestamp_seconds gauge
gpudiag_job_last_signal_timestamp_seconds{{job_id="slurm:7",owner_uid="{ALICE}"}} {NOW - 12}
gpudiag_job_last_signal_timestamp_seconds{{job_id="slurm:7",owner_uid="{MALLORY}"}} {NOW - 1}
# TYPE gpudiag_job_stalled_seconds gauge
gpudiag_job_stalled_seconds{{cause="hung",job_id="slurm:7",owner_uid="{MALLORY}"}} 95.0
"""


def slurm_job(jid: int, uid: int | None) -> SlurmJob:
    return SlurmJob(id=jid, name="train", user="alice", account="a", partition="p", state="RUNNING",
                    reason="None", nice=0, priority=1, submit=NOW - 60, start=NOW - 30, time_limit_s=None,
                    gpus=1, user_id=uid)


def test_an_agents_exposition_gives_age_since_last_report_not_trace_age():
    sigs = parse_metrics(EXPOSITION, NOW, prefix="slurm:")
    assert set(sigs) == {("slurm:7", ALICE), ("slurm:7", MALLORY)}
    s = sigs[("slurm:7", ALICE)]
    assert (s.mfu, s.label, s.confidence) == (0.31, "memory-bound", 0.8)
    assert s.age_s == 12.0  # the trace is 540 s old; the job reported 12 s ago
    assert signal_usable(s, Policy())
    assert math.isinf(parse_metrics(EXPOSITION, NOW)[("local:1", 0)].age_s)  # never heard: stale
    assert (s.stalled_s, s.stall_cause) == (None, None)   # alice's job finishes steps
    stuck = sigs[("slurm:7", MALLORY)]
    assert (stuck.stalled_s, stuck.stall_cause) == (95.0, "hung")


def test_a_slurm_job_gets_only_the_signal_its_own_user_wrote():
    read = SignalRead(parse_metrics(EXPOSITION, NOW, prefix="slurm:"))
    assert slurm_signals(read, [slurm_job(7, ALICE)])[7].mfu == 0.31
    assert slurm_signals(read, [slurm_job(7, 1003)]) == {}     # nobody's signal is that job's
    assert slurm_signals(read, [slurm_job(7, None)]) == {}     # no user id from squeue: none
    assert read.of("slurm:7", MALLORY).label == "input-bound"  # exported, but only as mallory's


def test_prometheus_answers_give_the_same_signals():
    def vec(metric, rows):
        return {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"__name__": metric, "job_id": "slurm:7", "instance": "n:9835",
                        "owner_uid": str(uid), **labels}, "value": [NOW - 5, str(value)]}
            for uid, value, labels in rows]}}
    answers = {"mfu": vec("gpudiag_job_mfu_ratio", [(ALICE, 0.31, {}), (MALLORY, 0.001, {})]),
               "label": vec("gpudiag_job_bottleneck", [(ALICE, 1, {"label": "memory-bound"}),
                                                       (MALLORY, 1, {"label": "input-bound"})]),
               "confidence": vec("gpudiag_job_signal_confidence", [(ALICE, 0.8, {}), (MALLORY, 1.0, {})]),
               "mfu_confidence": vec("gpudiag_job_mfu_confidence", [(ALICE, 0.9, {})]),
               "seen": vec("gpudiag_job_last_signal_timestamp_seconds", [(ALICE, NOW - 12, {}),
                                                                         (MALLORY, NOW - 1, {})]),
               "stalled": vec("gpudiag_job_stalled_seconds", [(MALLORY, 95.0, {"cause": "hung"})])}
    assert set(answers) == set(QUERIES)
    assert parse_prometheus_answers(answers, NOW) == parse_metrics(EXPOSITION, NOW, prefix="slurm:")


def test_a_report_dated_ahead_of_this_clock_is_never_fresh_and_two_nodes_compare_receive_times():
    ahead = EXPOSITION.replace(f"{NOW - 12}", f"{NOW + 27 * 3600}")   # a node whose clock runs 27 h ahead
    assert math.isinf(parse_metrics(ahead, NOW, prefix="slurm:")[("slurm:7", ALICE)].age_s)
    assert not signal_usable(parse_metrics(ahead, NOW, prefix="slurm:")[("slurm:7", ALICE)], Policy())
    near = EXPOSITION.replace(f"{NOW - 12}", f"{NOW + 2}")            # a clock 2 s ahead: fresh
    assert parse_metrics(near, NOW, prefix="slurm:")[("slurm:7", ALICE)].age_s == 0.0

    def answer(rows):   # a multi-node job reported by two agents
        def vec(metric, value_of):
            return {"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {"__name__": metric, "job_id": "slurm:7", "instance": inst,
                            "owner_uid": str(ALICE),
                            **({"label": "memory-bound"} if metric.endswith("bottleneck") else {})},
                 "value": [NOW, str(value_of(inst, row))]} for inst, row in rows.items()]}}
        return {"mfu": vec("gpudiag_job_mfu_ratio", lambda i, r: r[0]),
                "label": vec("gpudiag_job_bottleneck", lambda i, r: 1),
                "confidence": vec("gpudiag_job_signal_confidence", lambda i, r: 0.9),
                "seen": vec("gpudiag_job_last_signal_timestamp_seconds", lambda i, r: r[1])}
    # node b's clock runs a day ahead: its report is not "the freshest", node a's is
    sig = parse_prometheus_answers(answer({"a:9835": (0.3, NOW - 20), "b:9835": (0.6, NOW + 86400)}), NOW)
    assert sig[("slurm:7", ALICE)].mfu == 0.3 and sig[("slurm:7", ALICE)].age_s == 20.0


def test_squeue_gives_each_jobs_user_id_in_both_formats():
    """The uid a Slurm job's signals must come from: ``user_id`` of --json, ``%U`` of -o."""
    doc = {"jobs": [{"job_id": 7, "job_state": "RUNNING", "user_name": "alice", "user_id": ALICE,
                     "nodes": "n1", "node_count": 1, "tres_per_node": "gres:gpu:1", "nice": 0, "priority": 1,
                     "submit_time": 1, "start_time": 2, "time_limit": 60},
                    {"job_id": 8, "job_state": "PENDING", "user_name": "bob", "node_count": 1, "nice": 0,
                     "priority": 1, "submit_time": 1, "start_time": 0, "time_limit": None}]}
    assert [j.user_id for j in parse_squeue_json(json.dumps(doc))] == [ALICE, None]
    line = ("7|alice|acct|spot|RUNNING|None|0|100|2026-01-01T00:00:00|2026-01-01T00:01:00|1:00:00|"
            f"gres:gpu:1|1|4|n1|{ALICE}|my|job")
    (job,) = parse_squeue_fixed(line + "\n")
    assert (job.user_id, job.name) == (ALICE, "my|job")


def test_a_busy_machines_signal_orders_by_its_mfu_and_leaves_its_label_out():
    """The H200 LM beside 32 busy loops (tests/fixtures/h200-2026-11-30/busy): its label at
    confidence 0.05 (a busy machine moves every share), its MFU at 0.87 (23.1% at its own pace,
    23.6% quiet). Its MFU orders it; its label does not (no GPU-idle cap, no placement by it).
    Without an MFU confidence exported (an older agent), the label's stands for both, as before."""
    busy = EXPOSITION.replace(f'signal_confidence{{job_id="slurm:7",owner_uid="{ALICE}"}} 0.8',
                              f'signal_confidence{{job_id="slurm:7",owner_uid="{ALICE}"}} 0.05')
    busy = busy.replace(f'mfu_confidence{{job_id="slurm:7",owner_uid="{ALICE}"}} 0.9',
                        f'mfu_confidence{{job_id="slurm:7",owner_uid="{ALICE}"}} 0.87')
    sig = parse_metrics(busy, NOW, prefix="slurm:")[("slurm:7", ALICE)]
    assert (sig.confidence, sig.mfu_confidence) == (0.05, 0.87)
    assert signal_usable(sig, Policy())
    weighed = sig.scheduled(Policy().min_signal_confidence)
    assert (weighed.mfu, weighed.label, weighed.confidence) == (0.31, "unknown", 0.87)
    older = [x for x in busy.splitlines() if "mfu_confidence" not in x]
    old_sig = parse_metrics("\n".join(older) + "\n", NOW, prefix="slurm:")[("slurm:7", ALICE)]
    assert old_sig.mfu_confidence is None and not signal_usable(old_sig, Policy())
    assert old_sig.scheduled(Policy().min_signal_confidence) is old_sig


def test_a_keys_history_keeps_its_last_known_label_through_a_window_whose_label_was_not_trusted():
    """A busy window's signal orders by its MFU and leaves its label out (``Signal.scheduled``):
    the key's history then learns the MFU, and keeps the label it knew (a Slurm test's input-bound
    key read "unknown" after one such window, and its reason lost the label, 2026-12-01)."""
    book = MfuBook(half_life_s=1e9)
    book.observe("root/slowkey", "2-8 GPUs", 0.02, "input-bound", 0.0)
    book.observe("root/slowkey", "2-8 GPUs", 0.04, "unknown", 1.0)
    h = book.lookup("root/slowkey", 1.0)
    assert h is not None and h.label == "input-bound" and abs(h.mfu - 0.03) < 1e-9, h
    book.observe("root/slowkey", "2-8 GPUs", 0.5, "compute-bound", 2.0)   # a known label replaces it
    assert book.lookup("root/slowkey", 2.0).label == "compute-bound"
