"""The agent reads dcgm-exporter's HPC job-mapping folder as a Slurm prolog writes it: GPU series
get ``hpc_job`` (one series per listed job, as dcgm-exporter exports them) and the ``job_id`` a
job under ``gpudiag profile`` reports as, so a site already running those scripts needs no new
plumbing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from gpudiag.agent.attribution import MAX_MAPPING_BYTES, read_job_mapping
from tests.system.agent.test_agent import REPLAY, Agent, promtool_check

# What sites install as Slurm's prolog and epilog for dcgm-exporter (NVIDIA's documentation
# describes the folder; this is the usual script): one file per GPU the job holds, one job id a line.
PROLOG = """set -eu
for gpu in $(echo "$SLURM_JOB_GPUS" | tr ',' ' '); do
    echo "$SLURM_JOB_ID" >> "$DCGM_HPC_JOB_MAPPING_DIR/$gpu"
done
"""
EPILOG = """set -eu
for gpu in $(echo "$SLURM_JOB_GPUS" | tr ',' ' '); do
    f="$DCGM_HPC_JOB_MAPPING_DIR/$gpu"
    grep -vx "$SLURM_JOB_ID" "$f" > "$f.new" || true
    if [ -s "$f.new" ]; then mv "$f.new" "$f"; else rm -f "$f" "$f.new"; fi
done
"""


def slurm_script(script: str, folder, job: int, gpus: str) -> None:
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": str(job), "SLURM_JOB_GPUS": gpus,
           "DCGM_HPC_JOB_MAPPING_DIR": str(folder)}
    subprocess.run(["bash", "-c", script], env=env, check=True, timeout=30)


def gpu_up(text: str) -> list[dict[str, str]]:
    return [dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            for m in re.finditer(r"^gpudiag_gpu_up\{([^}]*)\} 1\.0$", text, re.M)]


def test_gpu_series_carry_the_jobs_a_slurm_prolog_mapped(tmp_path):
    mapping = tmp_path / "dcgm-job-map"
    mapping.mkdir()
    two_gpus = tmp_path / "two-h200.jsonl"   # the real H200 recording, on GPUs 0 and 1
    rows = [json.loads(line) for line in REPLAY.read_text().splitlines() if '"gpu"' in line]
    two_gpus.write_text("".join(json.dumps({**r, "gpu": g, "pids": []}) + "\n"
                                for r in rows[:5] for g in (0, 1)))
    slurm_script(PROLOG, mapping, 4242, "0,1")
    slurm_script(PROLOG, mapping, 4243, "1")   # a second job sharing GPU 1
    os.environ["DCGM_HPC_JOB_MAPPING_DIR"] = str(mapping)   # the variable dcgm-exporter reads
    try:
        agent = Agent(tmp_path / "state", backend=f"replay:{two_gpus}")
    finally:
        del os.environ["DCGM_HPC_JOB_MAPPING_DIR"]
    try:
        text = agent.metrics()
        env_job = subprocess.run([sys.executable, "-c", "from gpudiag.jobsignal import job_id_from_env;"
                                  "print(job_id_from_env('x'))"], env={**os.environ, "SLURM_JOB_ID": "4242"},
                                 capture_output=True, text=True, check=True).stdout.strip()
        assert env_job == "slurm:4242"   # what a job under gpudiag profile in Slurm job 4242 reports as
        up = sorted((s["gpu"], s["hpc_job"], s["job_id"]) for s in gpu_up(text))
        assert up == [("0", "4242", env_job), ("1", "4242", env_job), ("1", "4243", "slurm:4243")]
        check = promtool_check(text)
        assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr

        slurm_script(EPILOG, mapping, 4242, "0,1")   # the job ends: its lines go
        up = sorted((s["gpu"], s["hpc_job"], s["job_id"]) for s in gpu_up(agent.metrics()))
        assert up == [("0", "", ""), ("1", "4243", "slurm:4243")]
    finally:
        agent.stop()


def test_the_mapping_folder_is_read_as_dcgm_exporter_reads_it_and_no_further(tmp_path):
    (tmp_path / "0").write_text("17\n\n 17 \n18\n")      # blank lines skipped, each job once
    (tmp_path / "2.1").write_text("19\n")                # a MIG instance counts for its GPU
    (tmp_path / "notes.txt").write_text("20\n")          # not a GPU id: skipped
    (tmp_path / "+3").write_text("21\n")                 # nor this (dcgm-exporter refuses it too)
    # a line longer than a job id, and one the size bound cuts: both skipped, never shortened
    (tmp_path / "4").write_text("22\n" + "y" * 200 + "\n" + "z" * MAX_MAPPING_BYTES + "\n")
    os.symlink(tmp_path / "0", tmp_path / "5")           # a link is not followed
    os.mkfifo(tmp_path / "6")                            # a FIFO cannot stall the scrape
    (tmp_path / "7").mkdir()
    assert read_job_mapping(tmp_path) == {0: ["17", "18"], 2: ["19"], 4: ["22"]}


def test_a_mapped_job_is_named_by_its_mapping_files_owner_unless_root(tmp_path):
    """A prolog that writes a job's mapping file as the job's user (or hands it to them) names
    who runs a job that sends no signal: ``gpudiag fleet`` attributes its GPU-hours so."""
    import pwd

    nobody = pwd.getpwnam("nobody").pw_uid
    (tmp_path / "0").write_text("31\n")
    (tmp_path / "1").write_text("32\n")           # root's: a prolog's own file names nobody
    os.chown(tmp_path / "0", nobody, -1)
    owners: dict[str, int] = {}
    assert read_job_mapping(tmp_path, owners) == {0: ["31"], 1: ["32"]}
    mine = {} if os.geteuid() == 0 else {"slurm:32": os.getuid()}
    assert owners == {"slurm:31": nobody, **mine}


def test_each_job_exports_its_gpus_how_many_are_idle_and_who_runs_it(tmp_path):
    mapping = tmp_path / "dcgm-job-map"
    mapping.mkdir()
    rows = [json.loads(line) for line in REPLAY.read_text().splitlines() if '"gpu"' in line]
    busy = next(r for r in rows if r["gpm_sm_activity"] >= 50)
    idle = next(r for r in rows if r["gpm_sm_activity"] < 5)
    gpus = tmp_path / "gpus.jsonl"   # GPU 0 busy, GPU 1 idle, GPU 2 without GPM (utilisation 3%)
    gpus.write_text("".join(json.dumps(r) + "\n" for r in (
        {**busy, "gpu": 0, "pids": []}, {**idle, "gpu": 1, "pids": []},
        {**busy, "gpu": 2, "pids": [], "gpm_sm_activity": None, "util_gpu": 3})))
    (mapping / "0").write_text("51\n")
    os.chown(mapping / "0", 65534, -1)
    os.environ["DCGM_HPC_JOB_MAPPING_DIR"] = str(mapping)
    try:
        agent = Agent(tmp_path / "state", backend=f"replay:{gpus}")
    finally:
        del os.environ["DCGM_HPC_JOB_MAPPING_DIR"]
    try:
        text = agent.metrics()
        per_job = {(m.group(1), m.group(2)): m.group(3) for m in re.finditer(
            r'^gpudiag_gpus_(held|idle)\{job_id="([^"]*)"\} (\S+)$', text, re.M)}
        # GPU 0 busy, mapped to slurm:51; GPUs 1 (idle) and 2 (3% utilisation, no GPM) no job's
        assert per_job == {("held", "slurm:51"): "1.0", ("idle", "slurm:51"): "0.0",
                           ("held", ""): "2.0", ("idle", ""): "2.0"}
        import pwd

        name = pwd.getpwuid(65534).pw_name
        assert f'gpudiag_gpu_job_owner_info{{job_id="slurm:51",owner_uid="65534",user="{name}"}} 1.0' in text
        check = promtool_check(text)
        assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr
    finally:
        agent.stop()
