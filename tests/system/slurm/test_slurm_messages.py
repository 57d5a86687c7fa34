"""What the Slurm controller says, without a cluster: a round's text shows only what happened, a
munge outage is named as munge with its socket (from the words Slurm 22.05's clients print), and
a reservation behind a job without a time limit is not dated a year ahead. The same messages are
checked against a real Slurm in tests/system/slurm/test_slurm_admin.py and
tests/system/slurm/test_slurm.py."""

from __future__ import annotations

from gpudiag.scheduler.model import Cluster, Job, Node, Placement, Policy, Running, Signal, Tier
from gpudiag.scheduler.policy import schedule
from gpudiag.scheduler.priority import MfuBook
from gpudiag.scheduler.slurm.actions import Action
from gpudiag.scheduler.slurm.controller import RoundResult
from gpudiag.scheduler.slurm.loop import describe
from gpudiag.scheduler.slurm.outages import SourceOutages
from gpudiag.scheduler.slurm.slurmio import MungeUnavailable, _munge_outage

# scontrol ping's stderr with munged stopped (Debian's slurm-wlm 22.05.8, tests/slurm_cluster.py)
MUNGE_DOWN = """scontrol: error: If munged is up, restart with --num-threads=10
scontrol: error: Munge encode failed: Failed to access "/tmp/c/munge/munge.socket": No such file or \
directory (Did you start munged?)
scontrol: error: slurm_send_node_msg: auth_g_create: REQUEST_PING has authentication error
"""


def test_a_victim_is_shown_only_where_its_requeue_was_tried():
    res = RoundResult(at=0.0, signals={"available": True, "jobs": 2}, jobs={"pending": 1, "running": 2},
                      decisions=[{"kind": "preempt", "job_id": 1, "reason": "victim: ...; SIGTERM, 5 s"},
                                 {"kind": "hold", "job_id": 9, "reason": "head of the queue"}],
                      handed_back={9: "a candidate has no usable signal"})
    text = describe(res)
    assert "SIGTERM" not in text and "Slurm serves job 9: a candidate has no usable signal" in text
    res.actions = [Action("requeue", "1", "RUNNING", "PENDING", "victim", for_job=9)]
    res.handed_back = {}
    assert "preempt job 1: victim: ...; SIGTERM" in describe(res)


def test_a_munge_outage_is_named_as_munge_with_its_socket():
    line = _munge_outage(MUNGE_DOWN)
    assert line == ('munge at /tmp/c/munge/munge.socket unreachable: No such file or directory '
                    '(Did you start munged?)')
    e = MungeUnavailable(line, line.split(" unreachable", 1)[0])
    assert e.what == "munge at /tmp/c/munge/munge.socket"
    assert _munge_outage("slurm_load_partitions error: Unable to contact slurm controller") == ""


def test_an_agent_out_is_named_once_and_its_return_once():
    out = SourceOutages()
    assert out.update({"agent http://a:9835/metrics": "refused"}, now=0.0) == [
        "agent http://a:9835/metrics unreachable (refused): its jobs' signals are missing until it answers"]
    assert out.update({"agent http://a:9835/metrics": "timed out"}, now=5.0) == []   # same outage
    assert out.update({}, now=12.0) == ["agent http://a:9835/metrics answers again after 12 s"]


def test_a_reservation_behind_a_job_without_a_time_limit_is_not_dated():
    policy = Policy()
    blocker = Job(1, 4, 0.0, policy.default_estimate_s, tier=Tier.ON_DEMAND, preemptible=False)
    head = Job(2, 4, 10.0, 3600.0, tier=Tier.ON_DEMAND)
    run = Running(blocker, Placement(((0, (0, 1, 2, 3)),)), 0.0, policy.default_estimate_s, 0.0)
    decisions = schedule(Cluster((Node(0, 4, 0),)), [head], [run], {}, MfuBook(policy.history_half_life_s),
                         100.0, policy)
    hold = next(d for d in decisions if d.kind == "hold")
    assert "when a job without a time limit ends" in hold.reason and "days" not in hold.reason, hold.reason


def test_a_victim_that_ran_25_s_is_described_in_seconds_not_as_0_min_and_0_0_gpu_h():
    """Issue 41: a 20-30 s job read "0 min since checkpoint = 0.0 GPU-h"."""
    policy = Policy(min_runtime_s=0.0)
    spot = Job(1, 2, 0.0, 3600.0, tier=Tier.SPOT, preemptible=True)
    head = Job(2, 4, 70.0, 3600.0, tier=Tier.ON_DEMAND)
    other = Job(3, 2, 0.0, 3600.0, tier=Tier.SPOT, preemptible=True)
    runs = [Running(spot, Placement(((0, (0, 1)),)), 75.0, 3675.0, 75.0),
            Running(other, Placement(((0, (2, 3)),)), 75.0, 3675.0, 75.0)]
    signals = {1: Signal(0.05, "input-bound", 0.9, 99.0), 3: Signal(0.05, "input-bound", 0.9, 99.0)}
    book = MfuBook(policy.history_half_life_s)
    decisions = schedule(Cluster((Node(0, 4, 0),)), [head], runs, signals, book, 100.0, policy)
    reasons = [d.reason for d in decisions if d.kind == "preempt"]
    assert reasons, decisions
    assert all("MFU 5.0% x 2 GPUs x 25 s since checkpoint = 2.5 GPU-s" in r for r in reasons), reasons


def test_what_gpudiag_does_about_preemption_is_said_truly():
    from gpudiag.scheduler.slurm.qos import QosTiers
    from gpudiag.scheduler.slurm.says import mode_line

    assert mode_line(True, {"spot"}, None, {}).startswith("gpudiag chooses the preemption victims of "
                                                          "partition(s) spot")
    held_nothing = mode_line(True, set(), None, {"spot": "not held: ..."})
    assert held_nothing.startswith("gpudiag holds no partition")
    assert "Nice only, Slurm preempts" in held_nothing
    qos = QosTiers(line="PreemptType=preempt/qos: ... Nice only, Slurm preempts")
    assert mode_line(True, set(), qos, {}) == qos.line      # never "takes preemption over" on a QOS cluster


def test_restore_names_what_it_did_not_as_restored_restore():
    """Issue 41 saw "restored restore 3004"; a Nice and a PreemptMode each say what they are."""
    import logging

    from gpudiag.scheduler.slurm.actions import restore
    from gpudiag.scheduler.slurm.ledger import JobRef, LedgerStore, NiceEntry
    from gpudiag.scheduler.slurm.squeue import SlurmJob

    class IO:
        marked = None

        def jobs(self) -> list[SlurmJob]:
            return [SlurmJob(3004, "n", "u", "a", "spot", "PENDING", "Priority", 5000, 1, 1.0, 0.0, None, 1)]

        def set_nice_many(self, ids: list[int], nice: int) -> dict[int, str]:
            return {}

    store = LedgerStore(None)
    with store.update() as led:
        led.nice[3004] = NiceEntry(JobRef(3004, 1.0, 0), original=0, set=5000, want=None, at=1.0)
    logger = logging.getLogger("gpudiag.scheduler.slurm")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: seen.append(r.getMessage())
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        r = restore(IO(), store)          # type: ignore[arg-type]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    assert [a.applied for a in r.actions] == [True]
    assert "restored Nice of job 3004: 5000 -> 0" in seen and not any("restored restore" in m for m in seen)
