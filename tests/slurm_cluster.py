"""A real one-node Slurm cluster for tests: munged, slurmctld and slurmd on 127.0.0.1.

Everything lives under one folder the caller owns (a pytest tmp dir): the munge key and
socket, ``slurm.conf``, ``gres.conf``, spool and state folders, logs, and the fake GPU device
files (character devices 195:N, NVIDIA's major, made with mknod in that folder: Slurm only
stats them, nothing opens them). Ports are picked free. The daemons run in the foreground as
our children and are stopped by pid, so a test run never touches a system Slurm or munge.

Several nodes of different GPU counts (``nodes={"big": 8, "small": 4}``; 0 makes a CPU-only
node) are several slurmd on this one host, each started with ``-N NAME`` and listening on its own
``Port=`` (Slurm 22.05 built without ``--enable-multiple-slurmd`` accepts that: each slurmd
serves the node it is named for; spool, pid and log files are per node through ``%n``).

Slurm here is Debian's ``slurm-wlm`` (22.05 on bookworm). The configuration is the one
docs/slurm.md documents, with every delay shortened so a test sees preemption and requeue in seconds:

- three partitions as tiers on the one node (``spot`` < ``reserved`` < ``ondemand`` by
  ``PriorityTier``), ``PreemptType=preempt/partition_prio``, ``PreemptMode=REQUEUE``, a short
  ``GraceTime`` on the preemptible partitions;
- ``KillWait`` (SIGTERM -> SIGKILL on a requeue) and ``AuthInfo=cred_expire`` (the BeginTime
  hold of a requeued job: "how long a requeued job must wait before starting again") shortened;
- ``sched_interval`` short so the main scheduler (and its preemption) runs every few seconds.

Run ``python -m tests.slurm_cluster`` to start one by hand (Ctrl-C stops it).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpudiag.jobsignal import write_signal
from tests.harness import free_port

NODE = "gpunode"
GPUS = 4
NODES = {NODE: GPUS}        # the default cluster: one node of 4 GPUs
# The node claims more CPUs than this 2-core VM has (config_overrides lets slurmd accept the
# configured numbers): every test job asks for one CPU per GPU and CPU-only torch jobs are
# light, so the GPUs, not the CPUs, are what the jobs compete for.
CPUS = 8
NVIDIA_MAJOR = 195          # the character-device major of /dev/nvidia[0-9]
KILL_WAIT_S = 5             # Slurm default 30: SIGTERM -> SIGKILL of a requeued/cancelled job
GRACE_S = 10                # GraceTime of the preemptible partitions (Slurm default 0)
CRED_EXPIRE_S = 10          # Slurm default 120: also the BeginTime hold after a requeue
SCHED_INTERVAL_S = 2        # Slurm default 60: main scheduler period
CONTROLLER_INTERVAL_S = 5   # gpudiag's controller at its smallest --interval (its lease is then 15 s)
# Slurm alone: it preempts within a scheduling pass of the submit, the victim gets GraceTime, then
# SIGTERM (a sleep ends at once; KillWait bounds any other), then the job starts on the next pass.
SLURM_OWN_S = GRACE_S + KILL_WAIT_S + 2 * SCHED_INTERVAL_S
# How long a job the controller leaves or hands to Slurm may take to start: Slurm's own time, one
# controller round, and the 2-core VM's load (Slurm's RPCs and Python start-ups run slower there).
START_BOUND_S = SLURM_OWN_S + CONTROLLER_INTERVAL_S + 15
# partition name -> PriorityTier; the same names gpudiag's Slurm backend maps to its tiers
TIERS = {"spot": 1, "reserved": 2, "ondemand": 3}

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "squeue", "sbatch", "scontrol")


class SlurmUnavailable(RuntimeError):
    pass


def report(agent, jid: int, mfu: float, label: str = "compute-bound") -> None:  # an Agent
    """A signal for job ``jid`` dropped into the agent's spool, as a job under gpudiag profile does."""
    write_signal(agent.state / "spool", {"job_id": f"slurm:{jid}", "ts": time.time(), "mfu_ratio": mfu,
                                         "bottleneck": label, "confidence": 0.9, "step_seconds": 0.5})


def wait_for(what: str, ok, timeout: float = 120.0, every: float = 0.5):
    """Poll ``ok()`` until it returns something true (returned), or fail naming ``what``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = ok()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_while_progressing(what: str, ok, progress, quiet_s: float = 120.0,
                           timeout: float = 600.0, every: float = 1.0, explain=None):
    """Poll ``ok()`` until it returns something true (returned), for as long as the work it
    waits on goes on: fail naming ``what`` once ``progress()`` (anything that changes while
    that work moves, such as the bytes of the jobs' run folders) has stood still ``quiet_s``,
    or after ``timeout`` in all. A real job's event comes when it comes: on a loaded 2-core VM
    two profiled torch jobs took more than 180 s to send their first signals, and a fixed
    deadline failed jobs that were still working (issue 32). ``explain()``, where given, says
    what was seen instead, in the failure's message."""
    start = time.monotonic()
    last, moved = progress(), start
    while True:
        v = ok()
        if v:
            return v
        now = time.monotonic()
        seen = progress()
        if seen != last:
            last, moved = seen, now
        if now - moved > quiet_s or now - start > timeout:
            why = f"nothing moved for {now - moved:.0f} s" if now - moved > quiet_s else "still moving"
            instead = f"; {explain()}" if explain is not None else ""
            raise AssertionError(f"gave up after {now - start:.0f} s waiting for {what} ({why}){instead}")
        time.sleep(every)


def folder_bytes(folder: Path, name: str = "") -> tuple[int, int]:
    """How many files under ``folder`` (those with ``name`` in their path below it) and their
    bytes: a job's progress, for ``wait_while_progressing``."""
    sizes = []
    for p in folder.rglob("*"):
        try:
            if name in str(p.relative_to(folder)) and p.is_file():
                sizes.append(p.stat().st_size)
        except OSError:   # a file the job replaced between the listing and the look
            continue
    return len(sizes), sum(sizes)


def missing_binaries() -> list[str]:
    """Slurm/munge programs not on PATH (.ci/install-test-deps.sh installs them)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [b for b in SLURM_BINARIES if shutil.which(b, path=path) is None]


class SlurmCluster:
    """Start with ``start()``, stop with ``stop()`` (idempotent, by pid, whatever state)."""

    def __init__(self, root: Path, scheduler_params: str = "", nodes: dict[str, int] | None = None,
                 cluster_name: str = "gpudiagtest", extra_conf: str = "", slurm_user: str = "root",
                 partitions: str | None = None, preempt_type: str = "preempt/partition_prio") -> None:
        """``slurm_user``: who slurmctld runs as (SlurmUser); another than root needs ``root`` to be
        a folder that user can reach (pytest's tmp_path is private to root). ``partitions``: the
        ``PartitionName=`` lines in place of the three tiers over every node."""
        self.root = root
        self.slurm_user = slurm_user
        self.host = socket.gethostname().split(".")[0]
        self.nodes = dict(nodes or NODES)
        self.cluster_name = cluster_name
        self.extra_conf = extra_conf
        self.ctld_port = free_port()
        self.slurmd_ports = {n: free_port() for n in self.nodes}
        self.conf = root / "etc" / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.extra_sched = scheduler_params
        self.partitions = partitions
        self.preempt_type = preempt_type
        self.procs: dict[str, subprocess.Popen] = {}

    # --- environment for clients (sbatch, squeue, scontrol, the controller) -------------------
    @property
    def env(self) -> dict[str, str]:
        path = os.environ.get("PATH", "")
        if "/usr/sbin" not in path.split(":"):
            path += ":/usr/sbin:/sbin"
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": path}

    def log(self, name: str) -> Path:
        return self.root / "log" / f"{name}.log"

    # --- setup ----------------------------------------------------------------------------------
    def _write_files(self) -> None:
        for d in ("etc", "munge", "log", "state", "spool", "dev", "run"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
            os.chmod(self.root / d, 0o700)
        # munged wants its socket's folder searchable by all (any user's job authenticates)
        os.chmod(self.root / "spool", 0o755)
        if self.slurm_user != "root":   # slurmctld drops to SlurmUser: its config, state, log, pid file
            os.chmod(self.root / "etc", 0o755)
            for d in ("state", "log", "run"):
                shutil.chown(self.root / d, self.slurm_user)
        os.chmod(self.root / "munge", 0o711)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        gres = ["AutoDetect=off"]
        for node, gpus in self.nodes.items():
            (self.root / "dev" / node).mkdir(exist_ok=True)
            for i in range(gpus):
                p = self.root / "dev" / node / f"nvidia{i}"
                if not p.exists():
                    os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, i))
                gres.append(f"NodeName={node} Name=gpu File={p}")
        (self.root / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")
        sched = f"sched_interval={SCHED_INTERVAL_S},bf_interval=2"
        if self.extra_sched:
            sched += "," + self.extra_sched
        all_nodes = ",".join(self.nodes)
        parts = self.partitions if self.partitions is not None else "".join(
            f"PartitionName={name} Nodes={all_nodes} PriorityTier={tier} MaxTime=INFINITE State=UP "
            f"{'Default=YES ' if name == 'reserved' else ''}"
            f"{'PreemptMode=OFF' if name == 'ondemand' else f'PreemptMode=REQUEUE GraceTime={GRACE_S}'}\n"
            for name, tier in TIERS.items())
        r = self.root
        node = "\n".join(
            f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={self.slurmd_ports[n]} "
            f"CPUs={CPUS} RealMemory=1000 {f'Gres=gpu:{g} ' if g else ''}State=UNKNOWN"
            for n, g in self.nodes.items())
        self.conf.write_text(f"""# generated by tests/slurm_cluster.py
ClusterName={self.cluster_name}
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmUser={self.slurm_user}
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire={CRED_EXPIRE_S}
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}/slurmd-%n
SlurmctldPidFile={r / 'run'}/slurmctld.pid
SlurmdPidFile={r / 'run'}/slurmd-%n.pid
SlurmctldLogFile={self.log('slurmctld')}
SlurmdLogFile={self.root / 'log'}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SchedulerType=sched/backfill
SchedulerParameters={sched}
PriorityType=priority/basic
PreemptType={self.preempt_type}
PreemptMode=REQUEUE
KillWait={KILL_WAIT_S}
MinJobAge=600
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=5
{self.extra_conf}
{node}
{parts}""")

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.log(f"{name}.stdout"), "ab")  # lives as long as the daemon
        self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)
        out.close()

    def start_munged(self) -> None:
        m = self.root / "munge"
        self._spawn("munged", ["munged", "-F", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                               f"--log-file={self.log('munged')}", f"--seed-file={m / 'munged.seed'}"])
        self._wait(lambda: self.munge_socket.exists(), "munged", 20)

    def start_slurmctld(self, clear_state: bool = True) -> None:
        self._spawn("slurmctld", ["slurmctld", "-D", *(["-i"] if clear_state else []), "-f", str(self.conf)])
        self._wait(self.controller_up, "slurmctld", 30)

    def start_slurmd(self) -> None:
        for n in self.nodes:
            self._spawn(f"slurmd-{n}", ["slurmd", "-D", "-N", n, "-f", str(self.conf)])
        for n in self.nodes:
            self._wait(self.nodes_idle, f"slurmd-{n}", 60)

    def start(self) -> SlurmCluster:
        missing = missing_binaries()
        if missing:
            raise SlurmUnavailable(f"not installed: {', '.join(missing)} (Debian: slurm-wlm munge)")
        self._write_files()
        try:
            self.start_munged()
            self.start_slurmctld()
            self.start_slurmd()
        except BaseException:
            self.stop()
            raise
        return self

    # --- state ------------------------------------------------------------------------------------
    def run(self, *argv: str, timeout: float = 20, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
        return p

    def job(self, jid: int) -> dict[str, str]:
        """One job's fields from ``scontrol show job -o`` (Key=Value)."""
        out = self.run("scontrol", "show", "job", "-o", str(jid)).stdout
        return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)

    def preempt_mode(self, partition: str) -> str:
        out = self.run("scontrol", "show", "partition", partition, "-o").stdout
        return out.split("PreemptMode=", 1)[1].split()[0]

    def sbatch(self, name: str, partition: str, gpus: int, *extra: str, cpus: int = 1,
               script: str = "sleep 600", env: dict[str, str] | None = None) -> int:
        """A batch job (``--wrap`` of ``script``) as the caller; its id."""
        gres = [f"--gres=gpu:{gpus}"] if gpus else []
        p = subprocess.run(["sbatch", "--parsable", "-J", name, "-p", partition, *gres, "-c", str(cpus),
                            "-o", "/dev/null", *extra, "--wrap", script],
                           env=env or self.env, capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            raise RuntimeError(f"sbatch {name}: {p.stderr.strip()}")
        return int(p.stdout.strip().split(";")[0])

    def controller_up(self) -> bool:
        try:
            return self.run("scontrol", "ping", check=False, timeout=10).stdout.count("UP") > 0
        except subprocess.TimeoutExpired:
            return False

    def nodes_idle(self) -> bool:
        """Every node up (idle, mixed or allocated)."""
        try:
            p = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=10)
        except subprocess.TimeoutExpired:
            return False
        states = dict(line.split() for line in p.stdout.splitlines() if len(line.split()) == 2)
        return p.returncode == 0 and set(states) == set(self.nodes) and all(
            s.startswith(("idle", "mixed", "allocated")) for s in states.values())

    def _wait(self, ok, what: str, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            proc = self.procs.get(what)
            if proc is not None and proc.poll() is not None:
                raise SlurmUnavailable(f"{what} exited with {proc.returncode}: {self._tail(what)}")
            if ok():
                return
            time.sleep(0.3)
        raise SlurmUnavailable(f"{what} not ready in {timeout:.0f} s: {self._tail(what)}")

    def _tail(self, name: str) -> str:
        text = ""
        for p in (self.log(name), self.log(f"{name}.stdout")):
            if p.exists():
                text += p.read_text(errors="replace")[-1500:]
        return text.strip()

    def stop_daemon(self, name: str, timeout: float = 20) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def cancel_all(self, timeout: float = KILL_WAIT_S + 15) -> None:
        """The harness (never the controller) cancels every job of this cluster and waits for them."""
        if "slurmctld" not in self.procs:
            return
        try:
            self.run("scancel", "--user", str(os.getuid()), check=False)
            end = time.monotonic() + timeout
            while time.monotonic() < end and self.run("squeue", "-h", check=False).stdout.strip():
                time.sleep(0.5)
        except subprocess.TimeoutExpired:
            pass

    def forget_controllers(self) -> None:
        """No gpudiag controller's claim on this cluster (a failed test may have left one), and no
        reload mark: the cluster as no controller has seen it."""
        (self.root / "state" / "gpudiag-controller.claim").unlink(missing_ok=True)
        if "slurmctld" in self.procs:
            self.run("scontrol", "delete", "PartitionName=gpudiag-reload-mark", check=False)

    def reset(self) -> None:
        """The state a freshly started cluster has, for the next user of a shared one: slurmctld
        and every slurmd running, no job left, each partition's PreemptMode as slurm.conf sets it
        (a test or a controller may have changed it), no controller's claim."""
        if self.procs.get("slurmctld") is None or self.procs["slurmctld"].poll() is not None:
            self.start_slurmctld(clear_state=False)
        for n in self.nodes:
            proc = self.procs.get(f"slurmd-{n}")
            if proc is None or proc.poll() is not None:
                self._spawn(f"slurmd-{n}", ["slurmd", "-D", "-N", n, "-f", str(self.conf)])
        for n in self.nodes:
            self._wait(self.nodes_idle, f"slurmd-{n}", 60)
        self.cancel_all()
        self.forget_controllers()
        for name in TIERS if self.partitions is None else ():
            mode = "OFF" if name == "ondemand" else "REQUEUE"
            self.run("scontrol", "update", f"PartitionName={name}", f"PreemptMode={mode}")

    def _leftovers(self) -> list[int]:
        """Processes our daemons started that outlived them (slurmstepd and job scripts): their
        environment names this cluster's slurm.conf."""
        mark = f"SLURM_CONF={self.conf}".encode()
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) != os.getpid():
                try:
                    if mark in (d / "environ").read_bytes().split(b"\0"):
                        out.append(int(d.name))
                except OSError:
                    continue
        return out

    def stop(self) -> None:
        """Jobs cancelled, then slurmd, slurmctld, munged by pid, then any job process left."""
        self.cancel_all()
        for name in [*(f"slurmd-{n}" for n in self.nodes), "slurmctld", "munged"]:
            self.stop_daemon(name)
        for pid in self._leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpudiag-slurm-") as d:
        c = SlurmCluster(Path(d)).start()
        print(f"export SLURM_CONF={c.conf}")
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
        finally:
            c.stop()


@contextmanager
def slurm_running(folder: Path, **kw) -> Iterator[SlurmCluster]:  # SlurmCluster's options
    """A started cluster, stopped by pid however the tests that use it end."""
    missing = missing_binaries()
    assert not missing, f"not installed: {missing} (.ci/install-test-deps.sh installs slurm-wlm and munge)"
    c = SlurmCluster(folder, **kw)
    try:
        yield c.start()
    finally:
        c.stop()
