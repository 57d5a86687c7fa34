"""The Slurm controller beside an administrator, against a real Slurm (tests/slurm_cluster.py: one
node, 4 GPUs) and a real agent read with ``--agents``: what an administrator sets by hand stays
theirs (a job's Nice put back to its original, a partition's PreemptMode updated at runtime,
slurm.conf changed and reloaded), a future-dated signal changes nothing beyond its own honest
window, ``--partitions`` bounds what is managed, and outages (munge, an agent) are named once.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from gpudiag.jobsignal import write_signal
from tests.harness import free_port
from tests.slurm_cluster import CONTROLLER_INTERVAL_S as INTERVAL_S
from tests.slurm_cluster import SlurmCluster, report, slurm_running, wait_for
from tests.system.agent.test_agent import Agent, sample_value
from tests.system.slurm_faults.test_slurm_safety import Ctl, controller, gpudiag, held, running


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_running(tmp_path_factory.mktemp("slurm")) as c:
        yield c


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    with Agent(tmp_path_factory.mktemp("agent"), backend="none") as a:
        yield a


@pytest.fixture(autouse=True)
def _clean(cluster):
    yield
    cluster.cancel_all()
    cluster.forget_controllers()     # a claim or reload mark a failed test may have left
    for p in ("spot", "reserved"):   # what a failed test may have left
        cluster.run("scontrol", "update", f"PartitionName={p}", "PreemptMode=REQUEUE", check=False)


def dry_round(cluster: SlurmCluster, agent: Agent, ledger: Path, *extra: str) -> dict:
    p = gpudiag(cluster, "--dry-run", "--once", "--json", "--agents", f"127.0.0.1:{agent.port}",
                "--state", str(ledger), *extra)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.splitlines()[0])


def blocker_and_low_mfu_waiter(cluster: SlurmCluster, agent: Agent) -> tuple[int, int]:
    """A reserved job on all 4 GPUs (MFU 0.4) and a 2-GPU reserved job waiting behind it at MFU
    0.02: the one gpudiag penalises."""
    blocker = cluster.sbatch("blocker", "reserved", 4)
    running(cluster, blocker)
    report(agent, blocker, 0.4)
    waiting = cluster.sbatch("idle", "reserved", 2)
    report(agent, waiting, 0.02, "input-bound")
    return blocker, waiting


def test_an_admins_nice_back_to_its_original_is_theirs(cluster, agent, tmp_path):
    blocker, waiting = blocker_and_low_mfu_waiter(cluster, agent)
    ctl = controller(cluster, agent, tmp_path / "ledger.json", "--restore")   # --min-change-interval 0
    try:
        wait_for("gpudiag's penalty", lambda: int(cluster.job(waiting)["Nice"]) > 0, 8 * INTERVAL_S)
        cluster.run("scontrol", "update", f"JobId={waiting}", "Nice=0")       # the admin puts it back
        wait_for("the admin's Nice recognised", lambda: "(its original) by someone else" in ctl.text(),
                 5 * INTERVAL_S)
        time.sleep(2 * INTERVAL_S)                                             # two more rounds
        assert cluster.job(waiting)["Nice"] == "0"
    finally:
        assert ctl.stop() == 0, ctl.text()
    assert cluster.job(waiting)["Nice"] == "0" and ctl.text().count("by someone else") == 1, ctl.text()


def test_scontrol_update_preempt_mode_is_the_admins_until_slurm_conf_is_reloaded(cluster, agent, tmp_path):
    spot = cluster.sbatch("spot", "spot", 4)
    running(cluster, spot)
    report(agent, spot, 0.4)
    ledger = tmp_path / "ledger.json"
    ctl = controller(cluster, agent, ledger, "--restore")
    try:
        held(cluster)
        cluster.run("scontrol", "update", "PartitionName=spot", "PreemptMode=REQUEUE")   # handed back by hand
        wait_for("the admin's PreemptMode recognised", lambda: "(scontrol update, no reload" in ctl.text(),
                 5 * INTERVAL_S)
        time.sleep(2 * INTERVAL_S)
        assert cluster.preempt_mode("spot") == "REQUEUE"                 # not taken back
        assert json.loads(ledger.read_text())["theirs_modes"] == {"spot": "REQUEUE"}
        cluster.run("scontrol", "reconfigure")                           # slurm.conf is the word again
        wait_for("spot managed again", lambda: "gpudiag's to manage again" in ctl.text(), 5 * INTERVAL_S)
        held(cluster)
    finally:
        assert ctl.stop() == 0, ctl.text()
    assert cluster.preempt_mode("spot") == "REQUEUE"
    assert ctl.text().count("by someone else") == 1, ctl.text()


def test_slurm_conf_changed_and_reloaded_under_the_controller_is_not_restored_over(cluster, agent, tmp_path):
    spot = cluster.sbatch("spot", "spot", 4)
    running(cluster, spot)
    report(agent, spot, 0.4)
    ledger = tmp_path / "ledger.json"
    ctl = controller(cluster, agent, ledger)
    conf = cluster.conf.read_text()
    try:
        held(cluster)
        ctl.stop(9)                       # gone, with spot held in its ledger
        off = re.sub(r"(PartitionName=spot .*)PreemptMode=REQUEUE", r"\1PreemptMode=OFF", conf)
        assert off != conf
        cluster.conf.write_text(off)
        cluster.run("scontrol", "reconfigure")
        p = gpudiag(cluster, "--restore-only", "--state", str(ledger))
        assert p.returncode == 0, p.stdout + p.stderr
        assert cluster.preempt_mode("spot") == "OFF"                     # slurm.conf's, not the old REQUEUE
        assert "as slurm.conf now sets it" in p.stderr, p.stderr
        assert json.loads(ledger.read_text())["modes"] == {}
    finally:
        cluster.conf.write_text(conf)
        cluster.run("scontrol", "reconfigure")


def test_a_future_dated_signal_has_no_effect_beyond_its_own_honest_window(cluster, agent, tmp_path):
    low, other = cluster.sbatch("low", "spot", 2), cluster.sbatch("other", "spot", 2)
    running(cluster, low, other)
    report(agent, low, 0.05, "input-bound")
    report(agent, other, 0.3)
    forged = {"job_id": f"slurm:{low}", "ts": time.time() + 27 * 3600, "mfu_ratio": 0.6,
              "bottleneck": "compute-bound", "confidence": 0.9}
    write_signal(agent.state / "spool", forged)    # the job's own user, or a node whose clock runs ahead
    text = agent.metrics()
    assert sample_value(text, 'gpudiag_agent_signals_rejected_total{reason="future"}') >= 1
    series = f'{{job_id="slurm:{low}",owner_uid="0"}}'
    assert sample_value(text, f"gpudiag_job_mfu_ratio{series}") == 0.05
    assert sample_value(text, f"gpudiag_job_last_signal_timestamp_seconds{series}") <= time.time()
    ledger = tmp_path / "ledger.json"
    p = gpudiag(cluster, "--once", "--agents", f"127.0.0.1:{agent.port}", "--state", str(ledger))
    assert p.returncode == 0 and cluster.preempt_mode("spot") == "OFF", p.stdout + p.stderr
    od = cluster.sbatch("od", "ondemand", 2)         # Slurm's own choice would be job-list order
    res = dry_round(cluster, agent, ledger)
    victims = [d for d in res["decisions"] if d["kind"] == "preempt"]
    assert [d["job_id"] for d in victims] == [low] and "MFU 5.0%" in victims[0]["reason"], res["decisions"]
    report(agent, low, 0.04, "input-bound")        # the job's next honest signal is taken, not "stale"
    assert sample_value(agent.metrics(), f"gpudiag_job_mfu_ratio{series}") == 0.04
    cluster.run("scancel", str(od))
    p = gpudiag(cluster, "--restore-only", "--state", str(ledger))
    assert p.returncode == 0 and cluster.preempt_mode("spot") == "REQUEUE", p.stdout + p.stderr


def test_partitions_bounds_what_is_managed_and_the_top_tier_is_never_penalised(cluster, agent, tmp_path):
    blocker = cluster.sbatch("blocker", "ondemand", 4)
    running(cluster, blocker)
    report(agent, blocker, 0.4)
    res_job, od_job = cluster.sbatch("res", "reserved", 1), cluster.sbatch("od", "ondemand", 1)
    for j in (res_job, od_job):
        report(agent, j, 0.02, "input-bound")
    res = dry_round(cluster, agent, tmp_path / "dry.json")
    nice = {a["target"] for a in res["actions"] if a["kind"] == "nice"}
    assert nice == {str(res_job)}, res["actions"]                # the on-demand job keeps its Nice
    assert {a["target"] for a in res["actions"] if a["kind"] == "preempt_mode"} == {"spot", "reserved"}
    hold = next(d["reason"] for d in res["decisions"] if d["kind"] == "hold")
    assert "when a job without a time limit ends" in hold and "days" not in hold, hold
    # spot alone managed: reserved's job keeps its Nice, and spot is not held either - on this one
    # node an on-demand job would then make Slurm preempt reserved's jobs, which gpudiag does not
    # manage, in spot's place (takeover.unsafe_holds, from slurm-a)
    res = dry_round(cluster, agent, tmp_path / "dry.json", "--partitions", "spot")
    assert res["actions"] == [], res["actions"]
    assert any(n.startswith("partition spot: not held: a job of ondemand would make Slurm preempt partition "
                            "reserved's jobs") for n in res["notes"]), res["notes"]
    p = gpudiag(cluster, "--once", "--agents", f"127.0.0.1:{agent.port}", "--state", str(tmp_path / "l.json"),
                "--partitions", "spot,nosuch")
    assert p.returncode == 2 and "--partitions: this Slurm has no nosuch" in p.stdout + p.stderr, p.stderr
    assert "Traceback" not in p.stderr and cluster.preempt_mode("spot") == "REQUEUE"


def test_munge_down_and_a_dead_agent_are_each_named_once_with_their_address(cluster, agent, tmp_path):
    spot = cluster.sbatch("spot", "spot", 4)
    running(cluster, spot)
    report(agent, spot, 0.4)
    dead = f"127.0.0.1:{free_port()}"
    ctl = Ctl(cluster, tmp_path / "ledger.json", "--interval", f"{INTERVAL_S}s", "--agents",
              f"127.0.0.1:{agent.port},{dead}", "--restore")
    try:
        held(cluster)
        cluster.stop_daemon("munged")
        sock = str(cluster.munge_socket)
        wait_for("munge named", lambda: f"munge at {sock} unreachable" in ctl.text(), 6 * INTERVAL_S)
        time.sleep(2 * INTERVAL_S)     # several retries while it is down
        cluster.start_munged()
        wait_for("back", lambda: f"munge at {sock} reachable again" in ctl.text(), 6 * INTERVAL_S)
        time.sleep(INTERVAL_S)
    finally:
        assert ctl.stop() == 0, ctl.text()
    text = ctl.text()
    # the controller's own warning, once; a warning of what munge's absence stopped (preemption
    # given back, beside a busy loop the round had just taken it) quotes the cause too
    named = f"WARNING munge at {sock} unreachable"
    assert text.count(named) == 1, text
    assert "slurmctld" not in text.split(named)[1].split("reachable again")[0], text
    assert text.count(f"agent http://{dead}/metrics unreachable") == 1, text
    assert "scontrol ping: scontrol ping" not in text


def test_a_write_that_meets_munge_down_leaves_the_outage_to_be_named_once_by_the_loop(
        cluster, tmp_path, caplog):
    """The race CI met: a round took a partition, munge stopped, and the give-back named the
    outage as "slurmctld unreachable" before the loop named it again as munge's."""
    from gpudiag.scheduler.slurm.actions import Action, apply
    from gpudiag.scheduler.slurm.ledger import LedgerStore
    from gpudiag.scheduler.slurm.slurmio import MungeUnavailable, SlurmIO

    store = LedgerStore(tmp_path / "ledger.json")
    todo = [Action("preempt_mode", "spot", "REQUEUE", "REQUEUE", "give back"),
            Action("preempt_mode", "reserved", "REQUEUE", "REQUEUE", "give back")]
    cluster.stop_daemon("munged")
    try:
        with caplog.at_level("INFO", logger="gpudiag.scheduler.slurm"), pytest.raises(MungeUnavailable) as e:
            apply(todo, SlurmIO(env=cluster.env), store, time.time(), lambda ledger: None, 60.0)
    finally:
        cluster.start_munged()
    assert e.value.what == f"munge at {cluster.munge_socket}"
    assert str(cluster.munge_socket) not in caplog.text and "slurmctld" not in caplog.text, caplog.text
    assert "preempt_mode spot not done: Slurm cannot be reached" in caplog.text, caplog.text
    assert todo[1].error == "not tried: slurmctld unreachable" and not any(a.applied for a in todo)
    assert store.writes == 2     # the intents, then what became of them: nothing left unconfirmed


def test_penalties_are_lifted_once_the_signals_are_out_past_the_staleness_limit(cluster, agent, tmp_path):
    from gpudiag.scheduler.slurm.actions import restore
    from gpudiag.scheduler.slurm.controller import Controller, Options
    from gpudiag.scheduler.slurm.slurmio import SlurmIO
    from gpudiag.scheduler.slurm.sources import AgentsSource

    blocker, waiting = blocker_and_low_mfu_waiter(cluster, agent)
    io = SlurmIO(env=cluster.env)
    ctl = Controller(io, AgentsSource([f"127.0.0.1:{agent.port}"]), options=Options(min_change_interval_s=0),
                     ledger_path=tmp_path / "ledger.json")
    try:
        t = time.time()
        ctl.round(t)
        penalty = int(cluster.job(waiting)["Nice"])
        assert penalty > 0
        ctl.source = AgentsSource([f"127.0.0.1:{free_port()}"])     # the agent is gone
        limit = ctl.policy.max_signal_age_s
        ctl.round(t + 5)
        assert int(cluster.job(waiting)["Nice"]) == penalty               # out, but not for long yet
        res = ctl.round(t + 5 + limit + 1)
        lifted = [a for a in res.actions if a.kind == "restore" and a.target == str(waiting)]
        assert lifted and lifted[0].applied and "longer than the 300 s staleness limit" in lifted[0].reason
        assert cluster.job(waiting)["Nice"] == "0"
    finally:
        restore(io, ctl.store)


def in_process(cluster: SlurmCluster, agent: Agent, ledger: Path, io=None):
    """A controller whose rounds the test runs itself (``round``), on the real cluster and agent."""
    from gpudiag.scheduler.slurm.controller import Controller, Options
    from gpudiag.scheduler.slurm.slurmio import SlurmIO
    from gpudiag.scheduler.slurm.sources import AgentsSource

    return Controller(io or SlurmIO(env=cluster.env), AgentsSource([f"127.0.0.1:{agent.port}"]),
                      options=Options(min_change_interval_s=0), ledger_path=ledger)


def test_a_statistics_reset_after_an_admins_runtime_preempt_mode_changes_nothing(cluster, agent, tmp_path):
    """Issue 41: ``sdiag -r`` (and Slurm's midnight reset) was read as a reload of slurm.conf, and
    an administrator's runtime PreemptMode was overridden. A reload is the partitions rebuilt from
    slurm.conf; statistics are not read."""
    from gpudiag.scheduler.slurm.actions import restore

    spot = cluster.sbatch("spot", "spot", 4)
    running(cluster, spot)
    report(agent, spot, 0.4)
    ctl = in_process(cluster, agent, tmp_path / "ledger.json")
    try:
        ctl.round(time.time())
        assert cluster.preempt_mode("spot") == "OFF"
        cluster.run("scontrol", "update", "PartitionName=spot", "PreemptMode=REQUEUE")   # handed back by hand
        res = ctl.round(time.time())
        assert any("(scontrol update, no reload of slurm.conf)" in n for n in res.notes), res.notes
        cluster.run("sdiag", "-r")                                         # statistics reset
        for _ in range(2):
            res = ctl.round(time.time())
            assert cluster.preempt_mode("spot") == "REQUEUE", res.notes    # kept: the admin's
            assert not any("reloaded" in n for n in res.notes), res.notes
        cluster.run("scontrol", "reconfigure")                             # a reload: slurm.conf's word again
        res = ctl.round(time.time())
        assert any("gpudiag's to manage again" in n for n in res.notes), res.notes
        ctl.round(time.time())
        assert cluster.preempt_mode("spot") == "OFF"
    finally:
        restore(ctl.io, ctl.store)
        ctl.release()
    assert cluster.preempt_mode("spot") == "REQUEUE"


def test_a_second_controller_on_another_ledger_is_refused_naming_the_first(cluster, agent, tmp_path):
    """Issue 41: a second controller with its own --state read the first one's Nice 5000 as the
    job's original and set 10000. One controller per cluster: the second is refused in one line
    naming the first, also once the first stopped without restoring; never a Nice stacked."""
    blocker, waiting = blocker_and_low_mfu_waiter(cluster, agent)
    first = tmp_path / "unit" / "controller.json"          # as the systemd unit's, beside root's own
    first.parent.mkdir()
    ctl = controller(cluster, agent, first)
    second = ["--once", "--agents", f"127.0.0.1:{agent.port}", "--min-change-interval", "0",
              "--state", str(tmp_path / "by-hand.json")]
    try:
        wait_for("the first controller's penalty", lambda: int(cluster.job(waiting)["Nice"]) > 0,
                 8 * INTERVAL_S)
        penalty = int(cluster.job(waiting)["Nice"])
        p = gpudiag(cluster, *second)
        assert p.returncode == 2, p.stdout + p.stderr
        line = [ln for ln in p.stderr.splitlines() if "another gpudiag controller steers this cluster" in ln]
        assert len(line) == 1 and f"pid {ctl.proc.pid} on " in line[0], p.stderr
        assert f"--state {first}" in line[0], p.stderr
        assert int(cluster.job(waiting)["Nice"]) == penalty                  # not stacked
        ctl.stop(signal.SIGKILL)                                             # gone, its Nice left in Slurm
        p = gpudiag(cluster, *second)
        assert p.returncode == 2 and f"--restore-only --state {first}` on " in p.stderr, p.stderr
        assert int(cluster.job(waiting)["Nice"]) == penalty
        p = gpudiag(cluster, "--restore-only", "--state", str(first))
        assert p.returncode == 0 and cluster.job(waiting)["Nice"] == "0", p.stdout + p.stderr
        p = gpudiag(cluster, *second, "--restore")                          # the claim is free again
        assert p.returncode == 0, p.stdout + p.stderr
    finally:
        ctl.stop(signal.SIGKILL)
    assert cluster.job(waiting)["Nice"] == "0"


def test_restore_puts_back_the_mode_slurm_runs_and_names_an_unreloaded_slurm_conf_edit(
        cluster, agent, tmp_path):
    """Issue 41: restore wrote a slurm.conf edit that was never reloaded (REQUEUE -> CANCEL in the
    file): Slurm would have kept REQUEUE until the administrator reloads."""
    spot = cluster.sbatch("spot", "spot", 4)
    running(cluster, spot)
    report(agent, spot, 0.4)
    conf = cluster.conf.read_text()
    ctl = controller(cluster, agent, tmp_path / "ledger.json", "--restore")
    try:
        held(cluster)
        edited = re.sub(r"(PartitionName=spot .*)PreemptMode=REQUEUE", r"\1PreemptMode=CANCEL", conf)
        assert edited != conf
        cluster.conf.write_text(edited)                      # no scontrol reconfigure
        assert ctl.stop() == 0, ctl.text()
        assert cluster.preempt_mode("spot") == "REQUEUE"     # what Slurm ran, not the unloaded edit
        said = [ln for ln in ctl.text().splitlines() if "slurm.conf now sets PreemptMode=CANCEL" in ln]
        assert len(said) == 1 and "not reloaded yet" in said[0], ctl.text()
        cluster.run("scontrol", "reconfigure")               # the administrator's reload: now it is CANCEL
        assert cluster.preempt_mode("spot") == "CANCEL"
    finally:
        ctl.stop()
        cluster.conf.write_text(conf)
        cluster.run("scontrol", "reconfigure")
