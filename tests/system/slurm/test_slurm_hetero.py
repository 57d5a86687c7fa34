"""The Slurm controller on a real cluster of two nodes of different sizes (8 and 4 GPUs: two slurmd
on this host, tests/slurm_cluster.py) whose slurmctld runs as a non-root SlurmUser, with the
controller itself run as that user (what docs/slurm.md says to do), and as an ordinary user
(refused before any change: the cluster's claim lives where only root and the SlurmUser may write;
one line says so).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import time
import venv
from pathlib import Path

import pytest

from tests.harness import unix_users
from tests.slurm_cluster import (
    START_BOUND_S,
    SlurmCluster,
    report,
    slurm_running,
    wait_for,
)
from tests.system.agent.test_agent import Agent

NODES = {"gpu4": 4, "gpu8": 8}     # sorted names: the small node comes first (index 0)


@pytest.fixture(scope="module")
def users():
    """The SlurmUser and an ordinary user, both real and unprivileged."""
    with unix_users("gpsl") as made:
        yield made


@pytest.fixture(scope="module")
def open_dir():
    """A folder every user can reach (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="gpudiag-slurm-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(users, open_dir):
    (open_dir / "slurm").mkdir()
    with slurm_running(open_dir / "slurm", nodes=NODES, slurm_user=users[0].pw_name) as c:
        yield c


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    with Agent(tmp_path_factory.mktemp("agent"), backend="none") as a:
        yield a


@pytest.fixture(scope="module")
def user_python(open_dir):
    """A Python other users can run, importing this gpudiag: a venv on the system interpreter whose
    .pth adds this environment's site-packages (with its editable install) as a site dir."""
    env = open_dir / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    py = env / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "gpudiag-under-test.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return py


@pytest.fixture(autouse=True)
def _clean(cluster):
    yield
    cluster.cancel_all()
    cluster.forget_controllers()     # a claim or reload mark a failed test may have left
    for p in ("spot", "reserved"):
        cluster.run("scontrol", "update", f"PartitionName={p}", "PreemptMode=REQUEUE", check=False)


def as_user(user: pwd.struct_passwd, py: Path, cluster: SlurmCluster, *args: str,
            popen: bool = False) -> subprocess.CompletedProcess | subprocess.Popen:
    argv = [str(py), "-m", "gpudiag", "scheduler", "serve", "--backend", "slurm", *args]
    env = {"PATH": cluster.env["PATH"], "SLURM_CONF": str(cluster.conf), "HOME": "/", "LANG": "C.UTF-8"}
    kw = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": [], "env": env, "cwd": "/"}
    if popen:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)


def user_dir(open_dir: Path, user: pwd.struct_passwd, name: str) -> Path:
    d = open_dir / name
    d.mkdir(exist_ok=True)
    shutil.chown(d, user.pw_uid, user.pw_gid)
    return d


def test_slurm_user_runs_the_controller_and_an_ordinary_user_is_refused_in_one_line(
        cluster, agent, users, open_dir, user_python):
    slurm_user, ordinary = users
    spot = cluster.sbatch("spot", "spot", 8)
    wait_for("spot running", lambda: cluster.job(spot)["JobState"] == "RUNNING", 60)
    report(agent, spot, 0.4)
    agents = f"127.0.0.1:{agent.port}"
    mine = user_dir(open_dir, slurm_user, "slurm-user") / "ledger.json"
    p = as_user(slurm_user, user_python, cluster, "--once", "--agents", agents, "--state", str(mine))
    assert p.returncode == 0, p.stdout + p.stderr
    assert cluster.preempt_mode("spot") == "OFF" and cluster.preempt_mode("reserved") == "OFF"
    # a second round sees the hidden reload mark the first one made: no second one, no warning
    p = as_user(slurm_user, user_python, cluster, "--once", "--agents", agents, "--state", str(mine))
    assert p.returncode == 0 and "reload mark" not in p.stderr, p.stdout + p.stderr
    p = as_user(slurm_user, user_python, cluster, "--restore-only", "--state", str(mine))
    assert p.returncode == 0, p.stdout + p.stderr
    assert cluster.preempt_mode("spot") == "REQUEUE" and cluster.preempt_mode("reserved") == "REQUEUE"
    theirs = user_dir(open_dir, ordinary, "ordinary") / "ledger.json"
    p = as_user(ordinary, user_python, cluster, "--once", "--agents", agents, "--state", str(theirs))
    # refused before any change: the cluster's one-controller claim lives in StateSaveLocation, which
    # only root and the SlurmUser may write (issue 41), the two Slurm lets change partitions
    assert p.returncode == 2, p.stdout + p.stderr
    assert "only root and the SlurmUser may write" in p.stderr and "Traceback" not in p.stderr
    assert len([ln for ln in p.stderr.splitlines() if "claim" in ln]) == 1, p.stderr
    assert cluster.preempt_mode("spot") == "REQUEUE"
    assert not theirs.exists() or json.loads(theirs.read_text())["modes"] == {}   # nothing undone


def test_on_demand_job_gets_its_victims_on_the_one_node_it_fits(cluster, agent, users, open_dir, user_python):
    big = [cluster.sbatch(f"big{i}", "spot", 4, "-w", "gpu8") for i in range(2)]
    small = cluster.sbatch("small", "spot", 4, "-w", "gpu4")
    wait_for("spot jobs running", lambda: all(cluster.job(j)["JobState"] == "RUNNING" for j in (*big, small)),
             60)
    report(agent, big[0], 0.4)
    report(agent, big[1], 0.05, "input-bound")
    report(agent, small, 0.01, "input-bound")        # least useful, but its node cannot hold 8 GPUs
    ledger = user_dir(open_dir, users[0], "victims") / "ledger.json"
    ctl = as_user(users[0], user_python, cluster, "--interval", "5s", "--agents", f"127.0.0.1:{agent.port}",
                  "--state", str(ledger), "--restore", popen=True)
    try:
        wait_for("spot held", lambda: cluster.preempt_mode("spot") == "OFF", 40)
        od = cluster.sbatch("od", "ondemand", 8)
        t0 = time.monotonic()
        wait_for("the on-demand job running", lambda: cluster.job(od)["JobState"] == "RUNNING", START_BOUND_S)
        assert time.monotonic() - t0 <= START_BOUND_S
        assert cluster.job(od)["NodeList"] == "gpu8"
    finally:
        ctl.send_signal(signal.SIGTERM)
        _, err = ctl.communicate(timeout=60)
    assert ctl.returncode == 0, err
    assert all(f"requeue {j}: RUNNING -> PENDING" in err for j in big), err
    assert f"requeue {small}" not in err and int(cluster.job(small)["Restarts"]) == 0


def test_multi_node_job_short_of_cpus_on_the_small_node_goes_to_slurm(cluster, agent, users, open_dir,
                                                                      user_python):
    """A 12-GPU job over both nodes that Slurm cannot start for want of CPUs on the small node: the
    model sees the GPUs free, the CPU check hands the job to Slurm, which preempts the CPU job."""
    cpus = cluster.sbatch("cpus", "spot", 0, "-w", "gpu4", cpus=8)    # all of the small node's CPUs
    warm = cluster.sbatch("warm", "spot", 8, "-w", "gpu8")             # teaches the controller a key
    wait_for("jobs running", lambda: all(cluster.job(j)["JobState"] == "RUNNING" for j in (cpus, warm)), 60)
    report(agent, cpus, 0.3)
    report(agent, warm, 0.3)
    ledger = user_dir(open_dir, users[0], "twelve") / "ledger.json"
    ctl = as_user(users[0], user_python, cluster, "--interval", "5s", "--agents", f"127.0.0.1:{agent.port}",
                  "--state", str(ledger), "--restore", popen=True)
    try:
        wait_for("spot held", lambda: cluster.preempt_mode("spot") == "OFF", 40)
        cluster.run("scancel", str(warm))
        wait_for("the GPUs free", lambda: cluster.job(warm)["JobState"] not in ("RUNNING", "COMPLETING"), 30)
        twelve = cluster.sbatch("twelve", "reserved", 0, "-N", "2", "--ntasks=2", "--gpus=12")
        t0 = time.monotonic()
        wait_for("the 12-GPU job running", lambda: cluster.job(twelve)["JobState"] == "RUNNING" or
                 ctl.poll() is not None, START_BOUND_S)
        assert ctl.poll() is None, f"the controller died: {ctl.stderr.read()[-2000:]}"
        assert time.monotonic() - t0 <= START_BOUND_S
    finally:
        ctl.send_signal(signal.SIGTERM)
        _, err = ctl.communicate(timeout=60)
    assert ctl.returncode == 0, err
    assert "CPUs on gpu4" in err and "Traceback" not in err, err


def test_recorded_squeue_of_this_cluster_parses_with_each_nodes_own_size(cluster):
    """The model built from this cluster's own ``scontrol show node``: sizes per node, not the largest."""
    from gpudiag.scheduler.slurm.adapter import cluster_of
    from gpudiag.scheduler.slurm.slurmio import SlurmIO

    io = SlurmIO(env=cluster.env)
    model, index = cluster_of(io.nodes())
    assert {n: model.nodes[i].gpus for n, i in index.items()} == NODES
