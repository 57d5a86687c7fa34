"""Who may become Slurm's victim, and jobs modelled as Slurm models them, without a cluster: the
partitions gpudiag may hold without exposing another partition's jobs, ``--exclusive``,
heterogeneous and array jobs as squeue --json (Slurm 22.05) shows them, and the signal read's
round deadline. A real slurmctld runs the same code in tests/system/slurm_faults/test_slurm_safety.py and
tests/system/slurm/test_slurm_layouts.py."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import replace

from gpudiag.scheduler.model import Policy, Signal
from gpudiag.scheduler.policy import schedule
from gpudiag.scheduler.priority import MfuBook
from gpudiag.scheduler.slurm import sources
from gpudiag.scheduler.slurm.adapter import model_of
from gpudiag.scheduler.slurm.arrays import adopt_split_tasks
from gpudiag.scheduler.slurm.efficiency import nice_actions
from gpudiag.scheduler.slurm.ledger import JobRef, Ledger, NiceEntry
from gpudiag.scheduler.slurm.serve_jobs import Serving, serve_waiting
from gpudiag.scheduler.slurm.slurmconf import Partition, SlurmNode
from gpudiag.scheduler.slurm.squeue import SlurmJob, parse_squeue_json
from gpudiag.scheduler.slurm.takeover import ModeView, unsafe_holds

NODES = {"n1": SlurmNode("n1", 4, 8, 0, 1000.0, 0.0, "MIXED"),
         "n2": SlurmNode("n2", 4, 8, 0, 1000.0, 0.0, "IDLE"),
         "c1": SlurmNode("c1", 0, 8, 0, 1000.0, 0.0, "IDLE")}


def part(name: str, tier: int, mode: str, nodes: tuple[str, ...] = ("n1",)) -> Partition:
    return Partition(name, tier, mode, 10.0, nodes)


def parts(*ps: Partition) -> dict[str, Partition]:
    return {p.name: p for p in ps}


def unsafe(ps: dict[str, Partition], hold: set[str]) -> dict[str, str]:
    return unsafe_holds(ps, {n: p.preempt_mode for n, p in ps.items()}, NODES, hold)


def serve_spot_held(jobs: list, m, ps, nodes) -> tuple:  # the model, partitions, nodes
    """One round's serving of the waiting jobs with spot held at OFF and job 1 at MFU 0.3:
    (requeues, handed to Slurm, partitions to give back)."""
    modes = ModeView({"spot": "REQUEUE", "ondemand": "OFF"}, {"spot"})
    policy = replace(Policy(), min_runtime_s=0.0)
    decisions = schedule(m.cluster, m.pending, m.running, {1: Signal(0.3, "compute-bound", 0.9, 1.0)},
                         MfuBook(policy.history_half_life_s), 100.0, policy)
    s = Serving(jobs, {j.id: j for j in jobs}, m, modes, ps, nodes, decisions, {"spot"},
                lambda j: True, {}, set(), {}, False, 0.0, 100.0)
    return serve_waiting(s, allow_victims=True)


def test_a_cancel_partition_under_the_same_higher_tier_keeps_spot_and_reserved_from_being_held():
    spot, res, od = part("spot", 1, "REQUEUE"), part("reserved", 2, "REQUEUE"), part("ondemand", 3, "OFF")
    assert unsafe(parts(spot, res, od), {"spot", "reserved"}) == {}   # nobody else for Slurm to pick
    ps = parts(spot, res, od, part("canc", 1, "CANCEL"))
    why = unsafe(ps, {"spot", "reserved"})
    assert set(why) == {"spot", "reserved"}
    assert "ondemand would make Slurm preempt partition canc's jobs (PreemptMode=CANCEL) in place of spot's" \
        in why["spot"]
    for mode in ("SUSPEND", "GANG,SUSPEND", "REQUEUE"):   # any job Slurm may still take is exposed
        assert set(unsafe(parts(spot, od, part("other", 1, mode)), {"spot"})) == {"spot"}
    # a partition promised no preemption (OFF) is no victim, nor one on other GPU nodes, nor CPU-only ones
    for other in (part("vip", 1, "OFF"), part("far", 1, "CANCEL", ("n2",)),
                  part("cpu", 1, "CANCEL", ("c1",))):
        assert unsafe(parts(spot, od, other), {"spot"}) == {}


def test_a_cancel_partition_on_a_cpu_only_node_keeps_spot_from_being_held():
    """Issue 41: spot over a GPU node and a CPU node, a CANCEL partition on the CPU node. Held,
    spot's CPU-node jobs are out of Slurm's reach, and a higher-tier job there (asking for no
    GPUs) makes Slurm kill the CANCEL job; the rule looked at GPU nodes only."""
    spot, canc = part("spot", 1, "REQUEUE", ("n1", "c1")), part("canc", 1, "CANCEL", ("c1",))
    why = unsafe(parts(spot, canc, part("ondemand", 3, "OFF", ("n1", "c1"))), {"spot"})
    assert "ondemand would make Slurm preempt partition canc's jobs (PreemptMode=CANCEL) on c1 (no GPUs) " \
        "in place of spot's" in why["spot"]
    # a higher tier that shares only the CPU node with spot counts as well
    why = unsafe(parts(spot, canc, part("ondemand", 3, "OFF"), part("cpuod", 3, "OFF", ("c1",))), {"spot"})
    assert "a job of cpuod would make Slurm preempt partition canc's jobs" in why["spot"]
    # CPU nodes no higher tier reaches change nothing
    assert unsafe(parts(spot, canc, part("ondemand", 3, "OFF")), {"spot"}) == {}


def test_a_requeue_that_frees_no_cores_under_oversubscribe_does_not_make_room():
    """Issue 41: with OverSubscribe two jobs shared the node's cores; requeueing one frees no CPU,
    so a waiting job short of CPUs is not served by it (it is Slurm's, with its reason)."""
    from gpudiag.scheduler.slurm.takeover import fits_after

    node = {"n1": SlurmNode("n1", 4, 8, 8, 1000.0, 0.0, "ALLOCATED")}     # all 8 CPUs allocated
    a = job(1, "spot", "RUNNING", 2, gpu_index=((0, 1),))
    a, b = replace(a, cpus=8), replace(job(2, "spot", "RUNNING", 2, gpu_index=((2, 3),)), cpus=8)   # shared
    head = replace(job(3, "ondemand", "PENDING", 2), cpus=4)
    assert fits_after(head, ["n1"], [a], node, False) == ""                 # the old arithmetic: room
    assert fits_after(head, ["n1"], [a], node, False, [a, b, head]) == "needs 4 CPUs on n1, 0 would be free"
    c = replace(job(4, "spot", "RUNNING", 2, gpu_index=((2, 3),)), cpus=4)  # not oversubscribed: 4 + 4 = 8
    assert fits_after(head, ["n1"], [replace(a, cpus=4)], node, False, [replace(a, cpus=4), c]) == ""


def test_a_partition_left_to_slurm_exposes_the_ones_held_beside_it_in_turn():
    # canc (CANCEL, tier 2) shares n2 with reserved under "top": reserved cannot be held; spot (n1
    # only) meets canc under no tier, but held alone it would leave reserved's jobs on n1 as
    # ondemand's victims in its place
    ps = parts(part("spot", 1, "REQUEUE"), part("reserved", 2, "REQUEUE", ("n1", "n2")),
               part("canc", 2, "CANCEL", ("n2",)), part("ondemand", 3, "OFF"), part("top", 3, "OFF", ("n2",)))
    assert set(unsafe(ps, {"spot"})) == {"spot"}
    why = unsafe(ps, {"spot", "reserved"})
    assert set(why) == {"spot", "reserved"} and "partition canc's jobs" in why["reserved"]
    assert "ondemand would make Slurm preempt partition reserved's jobs" in why["spot"]


JOBS_JSON = {"jobs": [
    {"job_id": 7, "job_state": "PENDING", "state_reason": "Resources", "shared": "none", "tres_per_node":
     "gres:gpu:1", "node_count": 1, "partition": "ondemand", "array_job_id": 0, "het_job_id": 0},
    {"job_id": 9, "job_state": "RUNNING", "nodes": "n1", "shared": None, "gres_detail": ["gpu:1(IDX:3)"],
     "tres_per_node": "gres:gpu:1", "node_count": 1, "partition": "spot", "array_job_id": 3,
     "array_task_id": 0, "nice": 5000},
    {"job_id": 4, "job_state": "PENDING", "state_reason": "Resources", "tres_per_node": "gres:gpu:1",
     "node_count": 1, "partition": "reserved", "het_job_id": 4, "het_job_offset": 0, "features": ""},
    {"job_id": 5, "job_state": "PENDING", "state_reason": "Resources", "tres_per_node": "gres:gpu:1",
     "node_count": 1, "partition": "reserved", "licenses": "matlab:1"},
]}   # the fields as Slurm 22.05 printed them for sbatch --exclusive, --array=0-2 and a het job ":"


def test_exclusive_array_and_heterogeneous_jobs_are_read_as_slurm_shows_them():
    ex, task, het, lic = parse_squeue_json(json.dumps(JOBS_JSON))
    assert ex.exclusive and ex.unmodelled == "asks for whole nodes (--exclusive)"
    assert task.split_task and task.array_job_id == 3 and task.nice == 5000 and not task.unmodelled
    assert het.het_job_id == 4 and "heterogeneous job 4" in het.unmodelled
    assert lic.unmodelled == "asks for licenses (matlab:1)"


def job(jid: int, part_: str, state: str, gpus: int, **kw) -> SlurmJob:  # SlurmJob fields
    running = state == "RUNNING"
    return SlurmJob(jid, f"j{jid}", "u", "a", part_, state, "None" if running else "Resources", 0, 100 - jid,
                    10.0, 10.0 if running else 0.0, None, gpus, nodes=("n1",) if running else (),
                    cpus=gpus, **kw)


def test_an_exclusive_job_holds_and_needs_whole_nodes_and_waiting_it_is_slurms_with_its_reason():
    ps = parts(part("spot", 1, "OFF"), part("ondemand", 3, "OFF"))
    nodes = {"n1": NODES["n1"]}
    spot = job(1, "spot", "RUNNING", 3, gpu_index=((0, 1, 2),))
    ex = job(2, "ondemand", "PENDING", 1, exclusive=True)
    m = model_of([spot, ex], nodes, ps, {"spot"}, 5.0, 100.0)
    assert [p.gpus for p in m.pending] == [4]             # the whole 4-GPU node, not the one free GPU
    alone = job(3, "spot", "RUNNING", 1, exclusive=True, gpu_index=((0,),))
    run_ex = model_of([alone], nodes, ps, set(), 5.0, 100.0)
    assert run_ex.running[0].placement.gpus == 4          # nothing else starts beside it
    requeues, handed, give_back = serve_spot_held([spot, ex], m, ps, nodes)
    assert requeues == [] and give_back == {"spot"}
    assert handed == {2: "job 2 asks for whole nodes (--exclusive): gpudiag does not model that, so it "
                         "cannot start under the hold"}


def test_a_split_off_array_task_keeps_its_arrays_one_penalty_and_its_original():
    led = Ledger(nice={3: NiceEntry(JobRef(3, 10.0, 0), original=0, set=5000, want=None, at=1.0)})
    task = job(9, "spot", "PENDING", 1, array_job_id=3, restarts=1)
    task = replace(task, nice=5000)
    assert adopt_split_tasks(led, [task]) == [9]
    assert (led.nice[9].original, led.nice[9].set) == (0, 5000)
    book = MfuBook(Policy().history_half_life_s)
    sig = {9: Signal(0.05, "input-bound", 0.9, 1.0)}    # the same penalty as its array's: nothing to write
    ps = parts(part("spot", 1, "REQUEUE"), part("ondemand", 3, "OFF"))
    acts = nice_actions([task], ps, led.nice, set(), sig, book, 10.0, Policy(), 10_000, 0.0, 200)
    assert acts == []
    # a task whose Nice someone set, or that split off before gpudiag touched the array, is not ours
    assert adopt_split_tasks(Ledger(nice=dict(led.nice)), [replace(task, id=11, nice=7)]) == []
    assert adopt_split_tasks(led, [replace(task, id=12, array_job_id=8)]) == []


def test_agents_are_read_at_once_within_the_rounds_deadline(monkeypatch):
    monkeypatch.setattr(sources, "ROUND_DEADLINE_S", 1.0)
    hung = []
    for _ in range(5):   # listening, never answering: each would cost its whole timeout in turn
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        hung.append(s)
    try:
        src = sources.AgentsSource([f"127.0.0.1:{s.getsockname()[1]}" for s in hung])
        t0 = time.monotonic()
        read = src.read(time.time())
        took = time.monotonic() - t0
    finally:
        for s in hung:
            s.close()
    assert took < 3.0, took            # one deadline, not five timeouts in a row (5 s and more)
    assert not read.available and all(url in read.why for url in src.urls), read.why   # each named


def test_a_heterogeneous_component_is_never_gpudiags_victim_and_its_preemptor_goes_to_slurm():
    ps = parts(part("spot", 1, "OFF"), part("ondemand", 3, "OFF"))
    nodes = {"n1": NODES["n1"]}
    comp = job(1, "spot", "RUNNING", 4, gpu_index=((0, 1, 2, 3),), het_job_id=1)
    od = job(2, "ondemand", "PENDING", 2)
    m = model_of([comp, od], nodes, ps, {"spot"}, 5.0, 100.0)
    assert not m.running[0].job.preemptible     # Slurm requeues the whole heterogeneous job, not gpudiag
    requeues, handed, give_back = serve_spot_held([comp, od], m, ps, nodes)
    assert requeues == [] and give_back == {"spot"}
    assert handed[2] == ("job 1 could be its victim and is a component of heterogeneous job 1, which Slurm "
                         "preempts as a whole")
