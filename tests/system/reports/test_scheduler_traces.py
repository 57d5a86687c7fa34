"""Trace input: each format read right, bad input a one-line error or a counted rejection."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudiag.errors import BadInput
from gpudiag.scheduler.model import Tier
from gpudiag.scheduler.sim.traces import SWEEP_GAP_S, read_trace, slurm_duration
from tests.conftest import SHARED as SHARED_DATA

SHARED = SHARED_DATA / "clusters"

SACCT = """JobID|JobName|User|Account|QOS|Submit|Start|End|Elapsed|Timelimit|AllocTRES|State
101|train_bert|alice|nlp|normal|2024-03-01T10:00:00|2024-03-01T10:05:00|2024-03-01T12:05:00|02:00:00|04:00:00|billing=8,cpu=8,gres/gpu=4,mem=64G,node=1|COMPLETED
101.batch|batch||nlp||2024-03-01T10:05:00|2024-03-01T10:05:00|2024-03-01T12:05:00|02:00:00||cpu=8,gres/gpu=4|COMPLETED
102|sweep|bob|vision|spot|2024-03-01T10:30:00|2024-03-01T10:31:00|2024-03-02T11:31:00|1-01:00:00|2-00:00:00|cpu=64,gres/gpu:h100=16,node=2|COMPLETED
103|cpu_only|bob|vision|normal|2024-03-01T10:40:00|2024-03-01T10:41:00|2024-03-01T10:51:00|00:10:00|01:00:00|cpu=4,mem=8G|COMPLETED
104|urgent|carol|nlp|high|2024-03-01T11:00:00|2024-03-01T11:00:00|2024-03-01T11:30:00|30:00|UNLIMITED|gres/gpu=1|COMPLETED
"""


def sim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudiag", "sim", *args], capture_output=True, text=True,
                          timeout=120)


def one_line_error(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_sacct_export_jobs_tiers_keys_and_estimates(tmp_path):
    f = tmp_path / "sacct.txt"
    f.write_text(SACCT)
    tr = read_trace(f)
    assert tr.fmt == "sacct"
    by = {j.name: j for j in tr.jobs}
    assert set(by) == {"101", "102", "104"}                     # steps skipped, no-GPU job rejected
    assert tr.rejected == {"no GPUs": 1}
    assert (by["101"].gpus, by["101"].duration, by["101"].estimate) == (4, 7200.0, 14400.0)
    assert (by["102"].gpus, by["102"].duration, by["102"].tier) == (16, 90000.0, Tier.SPOT)
    assert by["104"].tier == Tier.ON_DEMAND and by["104"].estimate is None and by["104"].duration == 1800
    assert by["101"].key == "alice/train_bert" and by["101"].team == "nlp"
    assert by["101"].submit == 0.0 and by["102"].submit == 1800.0


def test_slurm_durations():
    assert slurm_duration("1-02:03:04") == 93784
    assert slurm_duration("02:03:04") == 7384
    assert slurm_duration("03:04") == 184
    with pytest.raises(ValueError):
        slurm_duration("UNLIMITED")


def test_philly_keys_are_sweeps(tmp_path):
    if not SHARED.is_dir():
        pytest.fail(f"test data missing: {SHARED}")
    lines = (SHARED / "philly.csv").read_text().splitlines()[:3001]
    f = tmp_path / "p.csv"
    f.write_text("\n".join(lines) + "\n")
    tr = read_trace(f)
    assert tr.fmt == "philly" and len(tr.jobs) == 3000 and tr.jobs[0].submit == 0.0
    last: dict[tuple, object] = {}
    for j in tr.jobs:   # submit-sorted
        prev = last.get((j.team, j.gpus))
        if prev is not None and j.submit - prev.submit <= SWEEP_GAP_S:
            assert j.key == prev.key
        elif prev is not None:
            assert j.key != prev.key
        assert j.key.startswith(f"{j.team}/{j.gpus}g/")
        last[(j.team, j.gpus)] = j


def test_tiresias_trace(tmp_path):
    if not SHARED.is_dir():
        pytest.fail(f"test data missing: {SHARED}")
    tr = read_trace(SHARED / "tiresias_60job.csv")
    assert tr.fmt == "tiresias" and len(tr.jobs) == 60
    assert tr.jobs[1].gpus == 8 and tr.jobs[1].submit == 30 and tr.jobs[1].key == "vgg11/8g"


def test_missing_columns_unknown_format_empty_and_missing_file(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text("timestamp,duration,cluster\n2017-10-09 07:01:55,66.0,vc\n")
    one_line_error(sim(str(f)), "lacks column", "num_gpus")
    f.write_text("a,b,c\n1,2,3\n")
    one_line_error(sim(str(f)), "unknown trace format")
    f.write_text("")
    one_line_error(sim(str(f)))
    f.write_bytes(b"\xff\xfe\x00garbage\x00")
    one_line_error(sim(str(f)))
    one_line_error(sim(str(tmp_path / "none.csv")), "cannot read trace")


def test_bad_rows_and_too_large_jobs_are_counted_not_fatal(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("job_id,num_gpu,submit_time,model_name,duration\n"
                 "0,1,0,vgg,100\n1,2,5,vgg,-3\n2,1,6,vgg,0\n3,x,7,vgg,10\n4,64,8,vgg,10\n5,4,9,res,50\n")
    p = sim(str(f), "--nodes", "2", "--json")
    assert p.returncode == 0, p.stderr
    m = json.loads(p.stdout)
    assert m["jobs"] == 2 and m["rejected"] == 4
    assert "2 (non-positive duration)" in p.stderr and "1 (larger than the cluster)" in p.stderr
    assert "1 (unparsable row)" in p.stderr and "Traceback" not in p.stderr
    f.write_text("job_id,num_gpu,submit_time,model_name,duration\n0,1,0,vgg,-1\n")
    one_line_error(sim(str(f)), "no usable jobs", "non-positive duration")
    f.write_text("job_id,num_gpu,submit_time,model_name,duration\n0,64,0,vgg,10\n")
    one_line_error(sim(str(f), "--nodes", "2"), "no job fits")


def test_bad_options_and_mfu_file(tmp_path):
    if not SHARED.is_dir():
        pytest.fail(f"test data missing: {SHARED}")
    trace = str(SHARED / "tiresias_60job.csv")
    one_line_error(sim(trace, "--policy", "sjf"), "--policy")
    one_line_error(sim(trace, "--nodes", "0"), "--nodes")
    one_line_error(sim(trace, "--rack-size", "-1"), "--rack-size")
    mfu = tmp_path / "mfu.csv"
    mfu.write_text("job,mfu,label\n0,1.5,compute-bound\n")
    one_line_error(sim(trace, "--mfu", str(mfu)), "--mfu", "line 2")
    mfu.write_text("jobid,value\n0,0.5\n")
    one_line_error(sim(trace, "--mfu", str(mfu)), "job,mfu")
    one_line_error(sim(trace, "--mfu", str(tmp_path / "missing.csv")), "cannot read --mfu")
    # measured values replace the synthetic ones: all jobs at 1% MFU change the MFU metrics
    mfu.write_text("job,mfu,label\n" + "".join(f"{i},0.01,input-bound\n" for i in range(60)))
    base = json.loads(sim(trace, "--nodes", "2", "--json").stdout)
    p = sim(trace, "--nodes", "2", "--json", "--mfu", str(mfu))
    assert p.returncode == 0 and "Traceback" not in p.stderr
    measured = json.loads(p.stdout)
    assert measured["contended_cluster_mfu"] < base["contended_cluster_mfu"]
    assert measured["contended_cluster_mfu"] <= 0.01 + 1e-9


@settings(deadline=None)
@given(st.lists(st.tuples(st.text(max_size=12), st.text(max_size=8), st.text(max_size=4),
                          st.text(max_size=8)), max_size=8),
       st.sampled_from(["timestamp,duration,num_gpus,cluster", "job_id,num_gpu,submit_time,duration",
                        "JobID|Submit|Elapsed|AllocTRES"]))
def test_any_text_is_read_or_refused_with_bad_input(tmp_path_factory, rows, header):
    sep = "|" if "|" in header else ","
    f = tmp_path_factory.mktemp("fuzz") / "t.txt"
    f.write_text(header + "\n" + "\n".join(sep.join(r) for r in rows) + "\n", encoding="utf-8",
                 errors="replace")
    try:
        tr = read_trace(f)
    except BadInput as e:
        assert "\n" not in str(e)
        return
    assert all(j.duration > 0 and j.gpus >= 1 for j in tr.jobs)
