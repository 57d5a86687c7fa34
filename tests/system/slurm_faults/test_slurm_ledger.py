"""The Slurm controller's ledger, history and options without a cluster: what a crash leaves, how a
reused job id is told apart, how an intent becomes a fact, what the CLI refuses. The same code
runs against a real slurmctld in tests/system/slurm_faults/test_slurm_safety.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from gpudiag.scheduler.model import UNKNOWN
from gpudiag.scheduler.priority import MfuBook
from gpudiag.scheduler.slurm.actions import Action, confirm, reconcile, record_intents
from gpudiag.scheduler.slurm.history import MAX_HALF_LIVES, History, load_history, save_history
from gpudiag.scheduler.slurm.ledger import (
    JobRef,
    Lease,
    Ledger,
    LedgerError,
    LedgerStore,
    conf_reloaded,
    parse_ledger,
)
from gpudiag.scheduler.slurm.slurmconf import ConfModes, Partition, conf_modes
from gpudiag.scheduler.slurm.squeue import SlurmJob, parse_squeue_json, tres
from gpudiag.scheduler.slurm.takeover import reconcile_modes


def sjob(jid: int, nice: int = 0, submit: float = 100.0, restarts: int = 0,
         state: str = "PENDING") -> SlurmJob:
    return SlurmJob(jid, "n", "u", "a", "spot", state, "Priority", nice, 1, submit, 0.0, None, 1,
                    restarts=restarts)


def test_a_reset_clusters_job_2_is_not_the_old_job_2_but_a_requeued_one_is():
    ref = JobRef.of(sjob(2, submit=100.0))
    assert ref.matches(sjob(2, submit=100.0))
    assert ref.matches(sjob(2, submit=160.0, restarts=1))      # requeued: Slurm reset its submit time
    assert not ref.matches(sjob(2, submit=5000.0))             # same id, a new job of a reset cluster
    assert not ref.matches(sjob(3, submit=100.0))


def test_intent_recorded_before_the_change_keeps_the_first_original():
    led = Ledger()
    j = sjob(7, nice=100)
    record_intents(led, [Action("nice", "7", "100", "5100", "low", ref=JobRef.of(j))], 1.0)
    assert (led.nice[7].original, led.nice[7].set, led.nice[7].want) == (100, None, 5100)
    # a crash after the scontrol: the job shows gpudiag's value; the next start resolves the intent
    reconcile(led, {7: sjob(7, nice=5100)}, [])
    assert (led.nice[7].original, led.nice[7].set, led.nice[7].want) == (100, 5100, None)
    # a second change records the original it had before gpudiag, never 5100
    record_intents(led, [Action("nice", "7", "5100", "2100", "less low", ref=JobRef.of(j))], 2.0)
    assert led.nice[7].original == 100 and led.nice[7].ours(2100) and led.nice[7].ours(5100)
    # a crash before the second scontrol: still at 5100, ours, the intent dropped
    reconcile(led, {7: sjob(7, nice=5100)}, [])
    assert (led.nice[7].set, led.nice[7].want) == (5100, None)


def test_a_crash_before_the_command_forgets_the_intent_and_someone_elses_nice_is_theirs():
    led = Ledger()
    record_intents(led, [Action("nice", "7", "0", "5000", "low", ref=JobRef.of(sjob(7)))], 1.0)
    reconcile(led, {7: sjob(7, nice=0)}, [])
    assert 7 not in led.nice                   # never applied: nothing to undo
    record_intents(led, [Action("nice", "7", "0", "5000", "low", ref=JobRef.of(sjob(7)))], 1.0)
    a = Action("nice", "7", "0", "5000", "low", applied=True)
    confirm(led, [a])
    reconcile(led, {7: sjob(7, nice=42)}, [])  # an admin set 42 since
    assert 7 not in led.nice and 7 in led.theirs   # never touched again (nice_actions skips it)
    reconcile(led, {}, [])
    assert 7 not in led.theirs                     # forgotten with the job


def test_partition_modes_reset_by_reconfigure_and_changed_by_an_admin():
    led = Ledger()
    record_intents(led, [Action("preempt_mode", "spot", "REQUEUE", "OFF", "take"),
                         Action("preempt_mode", "reserved", "REQUEUE", "OFF", "take")], 1.0)
    confirm(led, [Action("preempt_mode", "spot", "REQUEUE", "OFF", "take", applied=True),
                  Action("preempt_mode", "reserved", "REQUEUE", "OFF", "take", applied=True)])
    parts = {"spot": Partition("spot", 1, "REQUEUE", 0), "reserved": Partition("reserved", 2, "CANCEL", 0)}
    view = reconcile_modes(led, parts)
    assert view.reset == ["spot"] and view.held == set()
    assert any("CANCEL by someone else" in n for n in view.notes)
    assert led.modes == {}                     # neither is gpudiag's to restore any more


def test_an_admin_who_sets_a_jobs_nice_back_to_its_original_keeps_it():
    led = Ledger()
    record_intents(led, [Action("nice", "7", "0", "5000", "low", ref=JobRef.of(sjob(7)))], 1.0)
    confirm(led, [Action("nice", "7", "0", "5000", "low", applied=True)])
    notes: list[str] = []
    reconcile(led, {7: sjob(7, nice=0)}, notes)      # gpudiag set 5000; an admin put 0 back
    assert 7 not in led.nice and 7 in led.theirs
    assert notes == ["job 7: Nice set to 0 (its original) by someone else since gpudiag set 5000: theirs, "
                     "left alone from now on"]
    # gpudiag's own restore that a crash left unconfirmed is not an admin's
    record_intents(led, [Action("nice", "8", "0", "5000", "low", ref=JobRef.of(sjob(8)))], 1.0)
    confirm(led, [Action("nice", "8", "0", "5000", "low", applied=True)])
    record_intents(led, [Action("restore", "8", "5000", "0", "back", ref=JobRef.of(sjob(8)))], 2.0)
    reconcile(led, {8: sjob(8, nice=0)}, notes)
    assert 8 not in led.nice and 8 not in led.theirs


def _held(*names: str) -> Ledger:
    led = Ledger(boot="2026-11-28T10:00:00", marked=True)
    record_intents(led, [Action("preempt_mode", n, "REQUEUE", "OFF", "take") for n in names], 1.0)
    confirm(led, [Action("preempt_mode", n, "REQUEUE", "OFF", "take", applied=True) for n in names])
    return led


def test_a_reload_is_the_mark_gone_or_a_new_boot_never_a_statistics_counter():
    led = _held("spot")
    boot = led.boot
    assert conf_reloaded(led, boot, True) is False          # mark still there: no reload, sdiag -r or not
    assert conf_reloaded(led, boot, False) is True          # only a reload of slurm.conf removes it
    assert conf_reloaded(led, "2026-11-28T11:00:00", True) is True     # a restart read slurm.conf again
    assert conf_reloaded(Ledger(), boot, True) is None      # no round yet: unknown
    assert conf_reloaded(Ledger(boot=boot, marked=False), boot, False) is None   # never marked: unknown


def test_scontrol_update_back_to_the_original_is_the_admins_a_reload_is_a_reset():
    conf = ConfModes({"spot": "REQUEUE", "reserved": "REQUEUE"}, 0.0)
    parts = {"spot": Partition("spot", 1, "REQUEUE", 0), "reserved": Partition("reserved", 2, "OFF", 0)}
    led = _held("spot", "reserved")
    view = reconcile_modes(led, parts, False, conf)          # no reload since: an admin
    assert view.reset == [] and view.theirs == {"spot"} and view.held == {"reserved"}
    assert "spot" not in led.modes and led.theirs_modes == {"spot": "REQUEUE"}
    assert any("by someone else (scontrol update" in n for n in view.notes)
    assert reconcile_modes(led, parts, False, conf).theirs == {"spot"}    # kept
    view = reconcile_modes(led, parts, True, conf)           # then a reconfigure
    assert view.theirs == set() and led.theirs_modes == {}   # gpudiag's to manage again
    led = _held("spot")
    view = reconcile_modes(led, parts, True, conf)           # a reconfigure: a reset
    assert view.reset == ["spot"] and view.theirs == set()


def test_a_slurm_conf_changed_and_reloaded_is_the_admins_and_never_restored_over(tmp_path):
    conf_file = tmp_path / "slurm.conf"
    conf_file.write_text("PreemptMode=REQUEUE\nPartitionName=DEFAULT GraceTime=10\n"
                         "PartitionName=spot Nodes=n PreemptMode=OFF # held by the admin now\n"
                         "PartitionName=ondemand Nodes=n PreemptMode=off\nPartitionName=reserved Nodes=n\n")
    conf = conf_modes(conf_file)
    assert conf.modes == {"spot": "OFF", "ondemand": "OFF", "reserved": "REQUEUE"}
    led = _held("spot")
    view = reconcile_modes(led, {"spot": Partition("spot", 1, "OFF", 0)}, True, conf)
    assert led.modes == {} and view.held == set()     # OFF is slurm.conf's now: nothing to restore
    assert any("slurm.conf now sets PreemptMode=OFF" in n for n in view.notes)


def test_ledger_round_trip_and_a_schema_1_ledger_is_refused(tmp_path):
    store = LedgerStore(tmp_path / "l.json")
    with store.update() as led:
        led.cluster = {"name": "c", "controller": "h", "state": "/s"}
        led.lease = Lease(os.getpid(), "h", 1.0, 2.0)
        record_intents(led, [Action("nice", "3", "0", "500", "r", ref=JobRef(3, 9.0, 0))], 1.0)
    again = store.read()
    assert again.nice[3].ref == JobRef(3, 9.0, 0) and again.cluster["name"] == "c"
    with pytest.raises(LedgerError, match="schema 1"):
        parse_ledger(json.dumps({"schema": 1, "nice": {}}), "old.json")


def test_a_dead_holders_lease_is_not_live_on_its_host():
    import socket

    here = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not Lease(dead.pid, here, 0.0, time.time() + 60).live(time.time())
    assert Lease(dead.pid, "another-host", 0.0, time.time() + 60).live(time.time())   # only time tells


def test_history_is_replayed_through_the_policys_decay_and_bounded(tmp_path):
    path = tmp_path / "h.json"
    now = 10 * 86400.0
    h = History(MfuBook(86400.0))
    assert h.observe("1@0#0", "u/a", "1 GPU", 0.1, "input-bound", now - 86400.0)
    assert not h.observe("1@0#0", "u/a", "1 GPU", 0.9, "compute-bound", now)   # once per job run
    h.observe("2@0#0", "u/b", "1 GPU", 0.5, "compute-bound", now - (MAX_HALF_LIVES + 1) * 86400.0)
    save_history(path, h, now)
    back, warn = load_history(path, 86400.0, now)
    assert warn == ""
    a = back.book.lookup("u/a", now)
    assert a is not None and a.mfu == pytest.approx(0.1) and a.weight == pytest.approx(0.5)   # one half-life
    assert back.book.lookup("u/b", now) is None                                               # decayed away
    path.write_text("{not json")
    empty, warn = load_history(path, 86400.0, now)
    assert "starting empty" in warn and not empty.book.keys


def test_a_run_whose_first_signal_had_no_label_teaches_its_key_the_first_label_it_gives(tmp_path):
    path = tmp_path / "h.json"
    h = History(MfuBook(86400.0))
    assert h.observe("3@0#0", "u/slow", "2-8 GPUs", 0.0, UNKNOWN, 100.0)   # a busy machine's first read
    assert not h.observe("3@0#0", "u/slow", "2-8 GPUs", 0.0, UNKNOWN, 105.0)
    assert h.observe("3@0#0", "u/slow", "2-8 GPUs", 0.3, "input-bound", 110.0)
    assert not h.observe("3@0#0", "u/slow", "2-8 GPUs", 0.0, "host-bound", 115.0)   # once labelled, kept
    key = h.book.lookup("u/slow", 110.0)
    assert key is not None and key.label == "input-bound"
    assert key.mfu == 0.0 and key.weight == pytest.approx(1.0, abs=1e-3)   # one observation, its first MFU
    save_history(path, h, 120.0)
    back, warn = load_history(path, 86400.0, 120.0)
    assert warn == "" and back.book.lookup("u/slow", 120.0).label == "input-bound"
    assert not back.observe("3@0#0", "u/slow", "2-8 GPUs", 0.0, "compute-bound", 130.0)


def test_squeue_json_fields_the_controller_relies_on():
    doc = {"jobs": [{"job_id": 5, "job_state": "RUNNING", "nodes": "n1", "gres_detail": ["gpu:2(IDX:0-1)"],
                     "tres_per_node": "gres:gpu:2", "node_count": 1, "requeue": False, "preempt_time": 1700.0,
                     "restart_cnt": 2, "tres_alloc_str": "cpu=3,mem=2G,node=1", "submit_time": 1,
                     "start_time": 2, "priority": 1, "nice": None, "time_limit": None},
                    {"job_id": 6, "job_state": "COMPLETING", "nodes": "n1", "gres_detail": [],
                     "tres_per_node": "gres:gpu:1", "node_count": 1, "submit_time": 1, "start_time": 2,
                     "nice": 4294967290}]}   # 22.05 prints Nice -6 (a reclaim's lift) as unsigned
    run, stopping = parse_squeue_json(json.dumps(doc))
    assert (run.nice, stopping.nice) == (0, -6)
    assert (run.requeue, run.preempt_time, run.restarts, run.cpus, run.mem_mb, run.gpus) == \
        (False, 1700.0, 2, 3, 2048.0, 2)
    assert stopping.holds and stopping.nodes == ("n1",) and stopping.gpus == 1
    assert tres("cpu=2,mem=100M,node=1,billing=2") == (2, 100.0)


@pytest.mark.parametrize(("args", "says"), [
    (("--backend", "slurm", "--interval", "1s"), "at least 5 s"),
    (("--backend", "slurm", "--gpus", "0,1"), "--gpus does not apply to --backend slurm"),
    (("--backend", "slurm", "--monitor"), "--monitor does not apply to --backend slurm"),
    (("--backend", "slurm", "--agent-url", "http://x/metrics"), "use --agents HOST:PORT"),
    (("--prometheus", "http://p:9090"), "--prometheus is the Slurm controller's"),
    (("--backend", "slurm", "--once", "--watchdog"), "one of --restore-only, --watchdog and --once"),
])
def test_every_serve_option_is_honoured_by_its_backend_or_refused_in_one_line(args, says):
    p = subprocess.run([sys.executable, "-m", "gpudiag", "scheduler", "serve", *args], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and says in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_one_controller_per_cluster_whatever_its_ledger(tmp_path):
    """Issue 41: two controllers on two ledgers stacked their Nice. The claim in the cluster's state
    folder refuses the second, naming the first; it stays refused after the first stopped with
    changes left, and is free once they are restored."""
    from gpudiag.scheduler.slurm import claim

    path = tmp_path / claim.CLAIM_FILE
    t = time.time()
    assert claim.take(path, "ledger-a", "/var/lib/a.json", True, 15.0, t) is None
    with pytest.raises(claim.ClaimRefused) as e:          # the same process, so make the holder another
        c = claim.read_claim(path)
        c.pid, c.host = 1, "ctl-host"                     # pid 1 on another host: only time tells
        claim._write(path, c)
        claim.take(path, "ledger-b", "/root/b.json", False, 15.0, t + 1)
    assert "pid 1 on ctl-host, --state /var/lib/a.json" in str(e.value) and "stop it first" in str(e.value)
    with pytest.raises(claim.ClaimRefused) as e:          # its lease lapsed, its Nice values still set
        claim.take(path, "ledger-b", "/root/b.json", False, 15.0, t + 60)
    assert "--restore-only --state /var/lib/a.json` on ctl-host first" in str(e.value)
    assert claim.take(path, "ledger-a", "/var/lib/a.json", True, 15.0, t + 61) is None   # its own ledger
    assert claim.read_claim(path).held_by_me()
    claim.release(path, "ledger-a", False, t + 62)        # everything restored: the claim is gone
    assert not path.exists()
    assert claim.take(path, "ledger-b", "/root/b.json", False, 15.0, t + 63) is None
    claim.release(path, "ledger-b", True, t + 64)         # stopped with changes left: kept, lapsed
    assert claim.read_claim(path).holds and not claim.read_claim(path).live(t + 65)


def test_a_batched_nice_write_names_each_job_slurm_refused():
    from gpudiag.scheduler.slurm.slurmio import _per_job_errors

    # scontrol update JobId=2,999,5 Nice=700 (Slurm 22.05.8): 2 and 5 changed, exit 1
    assert _per_job_errors("Invalid job id specified for job 999\n", [2, 999, 5]) == {
        999: "Invalid job id specified"}
    assert _per_job_errors("7_1: Job has already finished\n", [7]) == {7: "Job has already finished"}
    assert _per_job_errors("Unable to contact slurm controller (connect failure)\n", [2, 5]) is None
