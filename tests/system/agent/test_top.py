"""``gpudiag top`` in a real terminal (tmux) over two real agents replaying recorded H200 and H100
readings, with real CPU training jobs reporting signals: two run by the local scheduler (tier,
reason, owner), one as Slurm job 4242 whose GPU a dcgm-exporter job-mapping folder names.

What a person would check: the GPU panel shows the recorded values (and "n/a" where the
recording has none), the jobs come in wasted-GPU-time order, the sort and owner-filter keys
work, Enter shows a job's report path, and ``--once --json`` says what the agents' /metrics say.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpudiag import contract as c
from gpudiag.agent.signals import prepare_spool
from tests.conftest import SHARED
from tests.harness import needs_torch
from tests.system.agent.test_agent import Agent
from tests.system.local_scheduler.test_local_scheduler import ROOT, Sched

needs_torch()
LOOP_JOB = ROOT / "tests" / "jobs" / "loop_job.py"
H200_RECORDING = ROOT / "tests" / "fixtures" / "h200" / "profile_gemm_gpu.jsonl"
H100_RECORDING = SHARED / "runs" / "h100-gpt-small" / "samples" / "gpu.jsonl"
SLURM_JOB = "4242"
WAIT_S = 180.0   # jobs must start, be traced and analysed on a busy 2-core machine


def recorded(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if '"gpu"' in line]


def busiest(rows: list[dict], key: str = "gpm_sm_activity") -> dict:
    return max((r for r in rows if isinstance(r.get(key), float) and r[key] == r[key]), key=lambda r: r[key])


def with_na(rows: list[dict]) -> dict:
    """A row where NVML had no value for a GPM metric (the H100's DRAM bandwidth of an idle
    window reads NaN, recorded as "n/a: not a number")."""
    return next(r for r in rows
                if any(str(v).startswith("n/a") for k, v in r.items() if k.startswith("gpm_")))


def replay_file(path: Path, rows: list[tuple[dict, list[int]]]) -> Path:
    """One recorded row per GPU (so every scrape reads the same values), with the PIDs of the
    job that holds it: the agent attributes it from the process's environment."""
    path.write_text("".join(json.dumps({**r, "gpu": g, "pids": pids}) + "\n"
                            for g, (r, pids) in enumerate(rows)))
    return path


# -- what a person reading the screen expects, formatted here from the recording ---------------
def shown_pct(v: object) -> str:
    return f"{v:.1f}%" if isinstance(v, float) else "n/a"


def shown_rate(tx: object, rx: object) -> str:
    if not isinstance(tx, float) or not isinstance(rx, float):
        return "n/a"
    b = (tx + rx) * 2**20
    if b == 0:
        return "0 B/s"
    assert 1e6 <= b < 1e9, b   # the recordings' PCIe traffic is in the MB/s range
    return f"{b / 1e6:.3g} MB/s"


def expected_cells(r: dict, job: str) -> list[str]:
    gib = 2**30
    return [shown_pct(r["gpm_sm_activity"]), shown_pct(r["gpm_any_tensor_activity"]),
            shown_pct(r["gpm_dram_bw_util"]), shown_rate(r["gpm_nvlink_tx_mib_s"], r["gpm_nvlink_rx_mib_s"]),
            shown_rate(r["gpm_pcie_tx_mib_s"], r["gpm_pcie_rx_mib_s"]),
            f"{r['mem_used'] / gib:.1f}/{r['mem_total'] / gib:.0f} GiB", f"{r['power_mw'] / 1000:.0f} W", job]


def metrics(agent: Agent) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(agent.metrics()) for s in fam.samples}


def job_value(m: dict, name: str, job: str) -> float | None:
    return next((v for (n, labels), v in m.items() if n == name and ("job_id", job) in labels), None)


def job_label(m: dict, job: str) -> str | None:
    return next((dict(lb)["label"] for (n, lb), v in m.items()
                 if n == c.JOB_BOTTLENECK and ("job_id", job) in lb and v == 1), None)


class Tmux:
    """A real terminal: a tmux server of our own (its own socket), killed at the end."""

    def __init__(self, command: str, width: int = 230, height: int = 50) -> None:
        assert shutil.which("tmux"), "tmux is not installed (.ci/install-test-deps.sh installs it)"
        self.sock = f"gpudiag-top-{uuid.uuid4().hex[:8]}"
        # COLUMNS/LINES (set under pytest) would override the pane's size for the app inside
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        subprocess.run(["tmux", "-L", self.sock, "new-session", "-d", "-s", "top", "-x", str(width),
                        "-y", str(height), command], check=True, timeout=30, env=env)

    def screen(self) -> str:
        return subprocess.run(["tmux", "-L", self.sock, "capture-pane", "-p", "-t", "top"],
                              capture_output=True, text=True, timeout=30).stdout

    def keys(self, *keys: str, literal: bool = False) -> None:
        flags = ["-l"] if literal else []
        subprocess.run(["tmux", "-L", self.sock, "send-keys", "-t", "top", *flags, *keys],
                       check=True, timeout=30)

    def wait(self, what: str, pred, timeout: float = 60.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            text = self.screen()
            if pred(text):
                return text
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}; the screen:\n{self.screen()}")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True, timeout=30)


def gpu_line(screen: str, port: int, gpu: int) -> str:
    return next((x for x in screen.splitlines() if re.match(rf"\s*127\.0\.0\.1:{port}\s+{gpu}\s", x)), "")


def job_group(run_dir: Path) -> int | None:
    """The training process's group: gpudiag profile starts the job in a group of its own
    (collectors/job.py), so signalling profile's group does not reach it."""
    try:
        return json.loads((run_dir / "run.json").read_text()).get("pid")
    except (OSError, ValueError):
        return None


def signal_groups(groups: list[int | None], sig: int) -> None:
    for g in groups:
        if g:
            try:
                os.killpg(g, sig)
            except ProcessLookupError:
                pass


def job_order(screen: str, jobs: list[str]) -> list[str]:
    """The job ids in the order their rows appear on screen (rows start with the job id)."""
    rows = [line.split()[0] for line in screen.splitlines() if line.split() and line.split()[0] in jobs]
    return rows


def waste_order(gpus: dict[str, int], mfu: dict[str, float]) -> list[str]:
    """The issue's definition, computed here from what the agents export: GPUs x (1 - MFU / the
    median MFU; every class here has fewer than 3 jobs, so the median is over all jobs."""
    med = statistics.median(mfu.values())
    return sorted(mfu, key=lambda j: -gpus[j] * (1 - mfu[j] / med))


GPU_FIELDS = {c.GPU_SM_ACTIVITY: "sm_active",
              c.GPU_TENSOR_ACTIVITY: "tensor_active",
              c.GPU_DRAM_BANDWIDTH: "dram_bw",
              c.GPU_MEMORY_USED: "mem_used_bytes", c.GPU_POWER: "power_watts"}
JOB_FIELDS = {c.JOB_MFU: "mfu", c.JOB_STEP_SECONDS: "step_seconds",
              c.JOB_CONFIDENCE: "confidence",
              c.JOB_DILATION: "dilation"}


def once_json_mismatches(doc: dict, jobs: list[str], nodes: dict[str, dict], port_a: int) -> list:
    """Where ``top --once --json`` differs from the agents' /metrics."""
    wrong = []
    if len(doc["devices"]) != 4:
        wrong.append(("devices", doc["devices"]))
    for d in doc["devices"]:
        m = nodes["a"] if d["node"] == f"127.0.0.1:{port_a}" else nodes["b"]
        for name, field in GPU_FIELDS.items():
            series = {v for (n, lb), v in m.items() if n == name and ("gpu", d["gpu"]) in lb}
            if series != ({d[field]} if d[field] is not None else set()):
                wrong.append((d["node"], d["gpu"], field, d[field], series))
    by_id = {j["job_id"]: j for j in doc["jobs"]}
    both = {**nodes["a"], **nodes["b"]}
    for j in jobs:
        for name, field in JOB_FIELDS.items():
            if by_id[j][field] != job_value(both, name, j):
                wrong.append((j, field, by_id[j][field], job_value(both, name, j)))
        if by_id[j]["label"] != job_label(both, j):
            wrong.append((j, "label", by_id[j]["label"], job_label(both, j)))
    return wrong


def test_top_in_a_terminal_over_replayed_gpus_and_real_jobs(tmp_path):
    a_dir, b_dir, mapping = tmp_path / "agent-a", tmp_path / "agent-b", tmp_path / "dcgm-job-map"
    # the agents start after the jobs (their replay files name the jobs' PIDs); the jobs report
    # into the spools meanwhile, which the agents take in at their first scrape
    prepare_spool(a_dir)
    prepare_spool(b_dir)
    mapping.mkdir()
    py = sys.executable
    # one OpenMP thread per job: tiny ops whose threads spin for two busy cores run 100x slower
    quiet = {"GPUDIAG_SIGNAL_INTERVAL": "1", "OMP_NUM_THREADS": "1"}
    sched = Sched(tmp_path, "--slots", "3", "--min-runtime", "0", "--agent-dir", str(a_dir), env=quiet)
    slurm = agent_a = agent_b = term = None
    def groups() -> list[int | None]:
        """Every process group of the three jobs: the scheduler's wrappers, gpudiag profile
        (which sends the signals), and the training processes."""
        wrappers = [j["pid"] for j in sched.ask({"op": "queue"})["jobs"]] if sched.proc.poll() is None else []
        runs = [*sorted((sched.state / "jobs").glob("*/run-*")), tmp_path / "slurm-run"]
        return [*wrappers, slurm.pid if slurm else None, *map(job_group, runs)]

    try:
        loop = [py, str(LOOP_JOB), "--forever", "--sleep"]
        spot = sched.submit("--gpus", "2", "--tier", "spot", "--name", "slow", "--", *loop, "0.2")
        ondemand = sched.submit("--gpus", "1", "--tier", "on-demand", "--name", "fast", "--", *loop, "0.01")
        queue = sched.wait("both jobs running", lambda j: all(j[i]["state"] == "running" and j[i]["pid"]
                                                               for i in (spot, ondemand)))
        slurm = subprocess.Popen(
            [py, "-m", "gpudiag", "profile", "--out", str(tmp_path / "slurm-run"), "--skip", "3",
             "--steps", "2", "--", *loop, "0.08"],
            env={**os.environ, **quiet, "SLURM_JOB_ID": SLURM_JOB, "GPUDIAG_AGENT_DIR": str(b_dir)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        (mapping / "1").write_text(f"{SLURM_JOB}\n")   # what Slurm's prolog writes for GPU 1

        h200, h100 = recorded(H200_RECORDING), recorded(H100_RECORDING)
        pid_spot, pid_od = queue[spot]["pid"], queue[ondemand]["pid"]
        node_a = [(busiest(h200), [pid_spot]), (busiest(h200, "gpm_dram_bw_util"), [pid_spot])]
        node_b = [(busiest(h100), [pid_od]), (with_na(h100), [])]
        agent_a = Agent(a_dir, backend=f"replay:{replay_file(tmp_path / 'a.jsonl', node_a)}")
        os.environ["DCGM_HPC_JOB_MAPPING_DIR"] = str(mapping)
        try:
            agent_b = Agent(b_dir, backend=f"replay:{replay_file(tmp_path / 'b.jsonl', node_b)}")
        finally:
            del os.environ["DCGM_HPC_JOB_MAPPING_DIR"]

        prefix = sched.ask({"op": "queue"})["prefix"]
        j_spot, j_od, j_slurm = f"{prefix}:{spot}", f"{prefix}:{ondemand}", f"slurm:{SLURM_JOB}"
        jobs = [j_spot, j_od, j_slurm]
        deadline = time.monotonic() + WAIT_S
        while True:   # every job has reported an MFU and a label to its agent
            ma, mb = metrics(agent_a), metrics(agent_b)
            mfu = {j: job_value(ma, c.JOB_MFU, j) for j in (j_spot, j_od)}
            mfu[j_slurm] = job_value(mb, c.JOB_MFU, j_slurm)
            if all(mfu.values()) and job_label(ma, j_od) and job_label(mb, j_slurm):
                break
            assert time.monotonic() < deadline, f"no MFU from every job: {mfu}"
            time.sleep(1.0)
        # hold the jobs still (SIGSTOP), so every reader below sees the same signals: the agents
        # take in what their spools hold at the next scrape, and nothing after (a signal caught
        # half written stays a dot file, which the agent leaves alone)
        signal_groups(groups(), signal.SIGSTOP)
        ma, mb = metrics(agent_a), metrics(agent_b)
        mfu = {j: job_value(ma if j != j_slurm else mb, c.JOB_MFU, j) for j in jobs}
        expected = waste_order({j_spot: 2, j_od: 1, j_slurm: 1}, mfu)
        assert expected == [j_spot, j_slurm, j_od]   # the scenario: 2 slow GPUs first, the fast job last

        # --once --json says what /metrics says
        once = [py, "-m", "gpudiag", "top", "--once", "--json", "--agent", f"127.0.0.1:{agent_a.port}",
                "--agent", f"127.0.0.1:{agent_b.port}"]
        doc = json.loads(subprocess.run(once, capture_output=True, text=True, timeout=60, check=True,
                                        env={**os.environ, "GPUDIAG_SCHEDULER_DIR": str(sched.state)}).stdout)
        assert not once_json_mismatches(doc, jobs, {"a": ma, "b": mb}, agent_a.port)
        assert [j["job_id"] for j in doc["jobs"]] == expected
        by_id = {j["job_id"]: j for j in doc["jobs"]}
        assert (by_id[j_spot]["gpus"], by_id[j_od]["gpus"], by_id[j_slurm]["gpus"]) == (2, 1, 1)
        owners = {j: by_id[j]["owner"] for j in jobs}
        assert owners[j_spot] == owners[j_od] == "root"   # from the scheduler's queue

        top = (f"env GPUDIAG_SCHEDULER_DIR={sched.state} {py} -m gpudiag top --interval 1s "
               f"--agent 127.0.0.1:{agent_a.port} --agent 127.0.0.1:{agent_b.port}")
        term = Tmux(top)
        term.wait("every GPU and job", lambda s: all(j in s for j in jobs) and "H100" in s)

        # the GPU panel: the recorded values, per GPU, and n/a where the recording has none (a
        # capture can catch a frame half drawn: the screen is read until it is whole)
        def gpu_panel_wrong(text: str) -> list:
            wrong = []
            for port, rows in ((agent_a.port, node_a), (agent_b.port, node_b)):
                for gpu, (row, _) in enumerate(rows):
                    job = {0: j_od, 1: j_slurm}[gpu] if port == agent_b.port else j_spot
                    line = gpu_line(text, port, gpu)
                    cells = expected_cells(row, job)
                    if not re.search(r"\s+".join(map(re.escape, cells)), line):
                        wrong.append((cells, line))
            return wrong

        screen = term.wait("the recorded values", lambda s: not gpu_panel_wrong(s), timeout=20)
        assert "n/a" in gpu_line(screen, agent_b.port, 1)

        # the job panel: waste order, the scheduler's tier and reason, the label with confidence
        screen = term.wait(f"waste order {expected}", lambda s: job_order(s, jobs) == expected)
        rows = {ln.split()[0]: ln for ln in screen.splitlines() if ln.split() and ln.split()[0] in jobs}
        q = {j["id"]: j for j in sched.ask({"op": "queue"})["jobs"]}
        assert " spot " in rows[j_spot] and " on-demand " in rows[j_od], rows
        assert q[spot]["why"][:20] in rows[j_spot] and q[ondemand]["why"][:20] in rows[j_od], (q, rows)
        assert f"{job_label(mb, j_slurm)} " in rows[j_slurm], rows
        assert rows[j_slurm].split()[1] == (owners[j_slurm] or "?"), rows

        # keys: s sorts by the next column (MFU, lowest first), r reverses it
        term.keys("s")
        by_mfu = sorted(jobs, key=lambda j: mfu[j])
        term.wait(f"sorted by MFU {by_mfu}", lambda s: "sort: mfu ·" in s and job_order(s, jobs) == by_mfu)
        term.keys("r")
        term.wait("reversed", lambda s: "sort: mfu (reversed)" in s and job_order(s, jobs) == by_mfu[::-1])

        # o filters by owner: the scheduler's jobs are root's; a user with no job shows none
        box = "owner (empty: everyone)"   # the filter box's prompt: type only once it is open

        def owner_filter(owner: str) -> None:
            term.keys("o")
            term.wait("the owner box", lambda s: box in s)
            if owner:
                term.keys(owner, literal=True)
            term.keys("Enter")

        owner_filter("root")
        roots = sorted(j for j in jobs if owners[j] == "root")
        term.wait(f"only {roots}", lambda s: "owner: root" in s and sorted(job_order(s, jobs)) == roots)
        nobody = f"nobody{uuid.uuid4().hex[:6]}"
        owner_filter(nobody)
        term.wait("no job", lambda s: f"no jobs of owner {nobody}" in s and job_order(s, jobs) == [])
        owner_filter("")
        term.wait("filter cleared", lambda s: "owner: all" in s and len(job_order(s, jobs)) == 3)

        # Enter shows the selected job's report path: the first row is the most wasteful job's
        run_dir = next(dict(lb)["run_dir"] for (n, lb), v in metrics(agent_a).items()
                       if n == c.JOB_RUN_INFO and ("job_id", j_spot) in lb)
        assert run_dir == str(sched.state / "jobs" / str(spot) / "run-1")
        term.keys("s", "s", "s", "s", "s", "s")   # the sort cycle back to waste
        term.wait("waste order", lambda s: "sort: waste (reversed)" in s)
        term.keys("r")
        term.wait("waste order", lambda s: "sort: waste ·" in s and job_order(s, jobs) == expected)
        term.keys("Enter")
        term.wait("report path", lambda s: f"{j_spot}: no report yet in {run_dir}" in s)

    finally:
        if term is not None:
            term.kill()
        signal_groups(groups(), signal.SIGKILL)
        if slurm is not None:
            slurm.wait(timeout=30)
        sched.stop()
        for a in (agent_a, agent_b):
            if a is not None and a.proc.poll() is None:
                a.stop()


def test_top_marks_a_job_that_ended_then_drops_it(tmp_path):
    """A job's final signal (``ended``) reaches the agent: the view marks its row "(ended)" with
    its last values for one refresh, then drops it; a running job stays."""
    from gpudiag.jobsignal import write_signal
    from tests.system.agent.test_agent import full_signal

    state = tmp_path / "agent"
    spool = prepare_spool(state)
    write_signal(spool, full_signal("run:7", mfu_ratio=0.30))
    write_signal(spool, full_signal("run:8", mfu_ratio=0.20))
    agent = Agent(state)
    term = None
    try:
        term = Tmux(f"{sys.executable} -m gpudiag top --interval 3s --agent 127.0.0.1:{agent.port}")
        jobs = ["run:7", "run:8"]
        term.wait("both jobs running", lambda s: sorted(job_order(s, jobs)) == jobs and "(ended)" not in s)
        write_signal(spool, full_signal("run:7", mfu_ratio=0.31, ended=True))
        screen = term.wait("run:7 marked ended", lambda s: "run:7 (ended)" in s)
        assert "31.0%" in next(ln for ln in screen.splitlines() if "run:7 (ended)" in ln)  # last values
        term.wait("run:7 dropped, run:8 kept", lambda s: job_order(s, jobs) == ["run:8"])
        assert c.JOB_ENDED in agent.metrics()  # still there for Prometheus
    finally:
        if term is not None:
            term.kill()
        agent.stop()
