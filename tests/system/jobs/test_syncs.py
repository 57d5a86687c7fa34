"""Host syncs: counted per step at their call sites in a real CPU job, shown in every report, and
recommended away with a predicted step; and the GPU side read off real H100/H200 traces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.analyzers.breakdown import sum_breakdowns
from gpudiag.analyzers.diagnose import analyze_rank
from gpudiag.analyzers.syncs import DEVICE_WAITS, sync_report, trace_syncs
from gpudiag.analyzers.trace_loader import load_rank
from gpudiag.census import OPTIM_MARK
from gpudiag.diagnosis import Diagnosis
from gpudiag.reports.html import render_report
from gpudiag.rundir import read_steps, read_syncs
from tests.conftest import SHARED
from tests.paths import TESTS

JOB = TESTS / "jobs" / "sync_job.py"
SHARED_RUNS = SHARED / "runs"


def _marked_lines(marker: str = "  # sync: ") -> dict[str, int]:
    """Each ``# sync: NAME`` marker of the job, by name: its line number (1-based)."""
    out = {}
    for i, line in enumerate(JOB.read_text().splitlines(), 1):
        if marker in line:
            out[line.split(marker)[1].strip()] = i
    return out


def _profile(run: Path, *job_args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--skip", "4", "--steps", "3",
                           "--out", str(run), "--", sys.executable, str(JOB), "--steps", "12",
                           *job_args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def synced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    run = tmp_path_factory.mktemp("syncs") / "run"
    p = _profile(run)
    assert p.returncode == 0, p.stderr
    return run, p


def test_the_census_counts_each_sync_at_its_line_as_often_as_it_runs(synced):
    run, _ = synced
    census = read_syncs(run)[0]
    lines = _marked_lines()
    got = {(s.line, s.kind): s.calls for s in census.sites if s.file.endswith("sync_job.py")}
    assert got == {
        (lines["item-per-layer"], ".item()"): 3,
        (lines["cpu-means"], ".cpu()"): 2,
        (lines["bool-check"], "bool(tensor)"): 1,
        (lines["tolist"], ".tolist()"): 1,
        (lines["mask-index"], "boolean-mask indexing (data-dependent shape)"): 1,
        (lines["clip"], "bool(tensor)"): 1,
        (lines["loss-item"], ".item()"): 1,
    }
    # the dataset's .tolist() making each sample is input work, not counted
    assert all(s.line != _marked_lines(" # not a sync: ")["dataset"] for s in census.sites)
    clip = next(s for s in census.sites if s.line == lines["clip"])
    assert "via clip_grad_norm_" in clip.function  # a sync inside torch, charged to the job's line
    # the model's forward reads its layers' values back (they split a compiled graph); the
    # training loop's reads do not (blind check 40 was told its loop's reads were the forward's)
    inside = {s.line for s in census.sites if s.in_module}
    assert inside == {lines["item-per-layer"]}, census.sites
    # the census ran in the window's warm-up step, which the step rows mark (left out of references)
    rows = {r.step: r for r in read_steps(run)[0]}
    assert rows[census.step].profiler == "warmup"
    # abs and max were computed for .item() alone, 3 times a step each
    feeding = {op: calls for op, calls, _, _ in census.feeding_top}
    assert feeding["abs"] == 3 and feeding["max"] == 3


def test_the_diagnosis_json_counts_syncs_per_step_and_the_trace_agrees(synced):
    run, _ = synced
    d = Diagnosis.from_json((run / "diagnosis.json").read_text())
    s = d.syncs
    assert s is not None and s.per_step == 10
    assert s.by_kind == {".item()": 4, ".cpu()": 2, "bool(tensor)": 2, ".tolist()": 1,
                         "boolean-mask indexing (data-dependent shape)": 1}
    # the trace sees the scalar reads (4 item, 2 bool) and the mask's nonzero in every traced step;
    # .cpu() and .tolist() of a CPU tensor dispatch no operator
    assert s.trace_per_step == 7
    assert s.census_step is not None and s.feeding_ops >= 6
    assert 0 < s.saving_us < s.step_us
    assert s.saving_us == pytest.approx(s.host_us + s.feeding_us + s.after_us)  # a CPU: host work, no wait
    assert d.verdict.evidence["syncs_per_step"] == 10
    assert s.in_module_per_step == 3  # the forward's reads, by the census's call stacks
    # the share is of the step at the job's own pace (the wall step less other processes' time
    # on its cores), as the label's shares are: on a busy machine it is the larger of the two
    assert s.own_step_us is not None and 0 < s.own_step_us <= s.step_us
    assert d.verdict.evidence["sync_share"] == pytest.approx(s.saving_us / s.own_step_us)


def test_removing_the_syncs_is_recommended_with_a_predicted_step(synced):
    run, _ = synced
    d = Diagnosis.from_json((run / "diagnosis.json").read_text())
    rec = next(r for r in d.verdict.recommendations if r.action == "remove-host-syncs")
    assert rec.step_s is not None and rec.predicted_step_s is not None
    assert rec.predicted_step_s < rec.step_s
    # the job's own time less the saving, the machine's other work keeping its share of the step
    s = d.syncs
    own = s.own_step_us if s.own_step_us and s.own_step_us < s.step_us else s.step_us
    # as a ratio: where the view is the traced steps (a window the machine slowed, as in a CI run
    # at load 4), the entry is shown at the untraced steps' wall step, its ratio kept
    # (``advice._unobserved_frame``); elsewhere ``step_s`` is the syncs' step itself
    assert rec.predicted_step_s / rec.step_s == pytest.approx((own - s.saving_us) / own)
    if d.unprofiled is not None:
        assert rec.step_s == pytest.approx(s.step_us * 1e-6)
    assert d.syncs.sites[0].site in rec.text  # the busiest call site, named in the advice


def test_the_terminal_and_html_reports_show_the_syncs_and_their_sites(synced):
    run, p = synced
    site = f"tests/jobs/sync_job.py:{_marked_lines()['item-per-layer']}"
    assert "Host syncs: 10 per step" in p.stdout
    assert site in p.stdout and "[remove-host-syncs]" in p.stdout
    html = render_report(Diagnosis.from_json((run / "diagnosis.json").read_text()))
    assert 'id="syncs"' in html and site in html and "10 per step" in html


def test_the_same_job_without_its_syncs_has_none_and_no_such_advice(tmp_path):
    p = _profile(tmp_path / "run", "--syncs", "0")
    assert p.returncode == 0, p.stderr
    d = Diagnosis.from_json((tmp_path / "run" / "diagnosis.json").read_text())
    assert d.syncs is not None and d.syncs.per_step == 0 and d.syncs.trace_per_step == 0
    assert d.syncs.saving_us == 0
    assert "remove-host-syncs" not in {r.action for r in d.verdict.recommendations}


def test_torch_optims_own_item_calls_are_counted_apart_and_never_advised_away(tmp_path):
    """Adam's step on a CPU reads each parameter's step counter with ``.item()``: blind set 10
    was told to remove 162 such calls at its ``opt.step()`` line, which had none to remove."""
    run = tmp_path / "run"
    p = _profile(run, "--syncs", "0", "--adam")
    assert p.returncode == 0, p.stderr
    (census,) = read_syncs(run).values()
    optim = [s for s in census.sites if s.function.endswith(OPTIM_MARK)]
    assert sum(s.calls for s in optim) == 6, census.sites   # 3 layers: 6 tensors, one read each
    d = Diagnosis.from_json((run / "diagnosis.json").read_text())
    assert d.syncs is not None and d.syncs.per_step == 0 and d.syncs.saving_us == 0
    assert any("6 sync calls a step are torch.optim's own" in n for n in d.syncs.notes), d.syncs.notes
    assert "remove-host-syncs" not in {r.action for r in d.verdict.recommendations}


def test_a_census_file_a_job_tore_or_bloated_is_left_out(tmp_path):
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "syncs-rank-0.json").write_text('{"rank": 0, "sites": [{"calls"')
    (tmp_path / "samples" / "syncs-rank-1.json").write_text("[" * 200_000)
    (tmp_path / "samples" / "syncs-rank-2.json").write_text(json.dumps(
        {"rank": 2, "sites": [{"file": "a.py", "line": 3, "kind": ".item()", "calls": "x",
                               "seconds": 0.1}, {"file": "a.py", "line": 4, "kind": ".cpu()",
                                                 "calls": 2, "seconds": 1e-5}]}))
    got = read_syncs(tmp_path)
    assert set(got) == {2} and [s.line for s in got[2].sites] == [4]


@pytest.mark.parametrize("run", ["h100-gpt-small", "h100-resnet18-dl8", "h200-2026-11-27/gpt",
                                 "h200-2026-11-27/resnet_w14"])
def test_a_gpu_jobs_own_synchronize_calls_are_counted_with_the_device_idle_at_them(run):
    """The recorded jobs time each step with torch.cuda.synchronize() before and after it
    (runs/record_h100_runs.py): two device waits per step, both in the gap where the GPU's queue
    ran dry at the step's end, which is counted once and is part of the traced idle time."""
    rt = load_rank(SHARED_RUNS / run / "traces" / "rank-0.json.gz")
    got = trace_syncs(rt)
    assert got.steps == 5 and got.counts == {DEVICE_WAITS: 2.0}
    assert got.device_idle_us is not None and got.device_idle_us > 0
    rank = analyze_rank(rt, None).result
    traced = sum_breakdowns([s.breakdown for s in rank.steps], divide_by=len(rank.steps))
    assert got.device_idle_us < traced.idle  # a part of the traced idle time
    # the saving: bounded by the device's idle time at the syncs and by the host's wait in them
    r = sync_report(None, got, "gpu", traced, traced)
    assert r is not None and r.sites == [] and r.per_step == 2
    assert 0 < r.saving_us <= min(r.device_idle_us, got.host_us) + 1e-9
