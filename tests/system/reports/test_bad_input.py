"""Bad input gets one line and exit code 2, or a verdict with an explicit warning.

Never a traceback, never invented numbers.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.analyzers.diagnose import diagnose
from gpudiag.diagnosis import Bottleneck
from gpudiag.errors import TraceError
from gpudiag.rundir import RunInfo, write_run


def gpudiag(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudiag", *args], capture_output=True,
                          text=True, timeout=120)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0]


def test_truncated_gzip_is_a_one_line_error(traces, tmp_path):
    raw = (traces / "v100-single" / "rank-0.json.gz").read_bytes()
    bad = tmp_path / "rank-0.json.gz"
    bad.write_bytes(raw[: len(raw) // 2])
    assert_one_line_error(gpudiag("analyze", str(bad)), "truncated gzip")


def test_truncated_json_is_a_one_line_error(traces, tmp_path):
    text = gzip.decompress((traces / "mi250" / "rank-0.json.gz").read_bytes())
    bad = tmp_path / "rank-0.json"
    bad.write_bytes(text[: len(text) // 3])
    assert_one_line_error(gpudiag("analyze", str(bad)), "invalid or truncated JSON")


@pytest.mark.parametrize("content,needle", [
    (b"", "empty"),
    (b'{"hello": "world"}', "not a PyTorch profiler trace"),
    (b"\x00\x01binary", "invalid or truncated JSON"),
    (b'{"traceEvents": 5}', "not a PyTorch profiler trace"),
])
def test_files_that_are_not_traces_are_one_line_errors(tmp_path, content, needle):
    bad = tmp_path / "trace.json"
    bad.write_bytes(content)
    assert_one_line_error(gpudiag("analyze", str(bad)), needle)


def test_empty_trace_events_gives_no_numbers(tmp_path):
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": []}))
    d = diagnose(p, jobs=1)
    assert d.verdict.label is Bottleneck.UNKNOWN
    assert d.mfu.value is None
    assert any("no events" in w for w in d.warnings)


def test_missing_path_and_empty_folder_are_errors(tmp_path):
    assert_one_line_error(gpudiag("analyze", str(tmp_path / "nope")), "no such file")
    assert_one_line_error(gpudiag("analyze", str(tmp_path)), "no trace files")


def test_two_files_claiming_one_rank_is_an_error(traces, tmp_path):
    src = (traces / "mi250" / "rank-0.json.gz").read_bytes()
    doc = json.loads(gzip.decompress(src))
    doc["distributedInfo"] = {"rank": 0, "world_size": 2}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    (tmp_path / "b.json").write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="two files claim rank 0"):
        diagnose(tmp_path, jobs=1)


def test_negative_and_missing_durations_are_dropped_with_a_warning(traces, tmp_path):
    doc = json.loads(gzip.decompress((traces / "mi250" / "rank-0.json.gz").read_bytes()))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    kernels[0]["dur"] = -5
    del kernels[1]["dur"]
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps(doc))
    d = diagnose(p, jobs=1)
    assert any("negative duration" in w for w in d.warnings)
    assert any("without a timestamp or duration" in w for w in d.warnings)
    assert d.verdict.label is not Bottleneck.UNKNOWN


def test_unknown_device_name_is_an_error_naming_known_devices(traces):
    proc = gpudiag("analyze", str(traces / "mi250"), "--device", "TPUv9")
    assert_one_line_error(proc, "unknown device 'TPUv9'", "H100-SXM")


def test_peak_options_must_come_together(traces):
    assert_one_line_error(gpudiag("analyze", str(traces / "mi250"), "--peak-tflops", "100"),
                          "--peak-gbps")


@pytest.mark.parametrize("name", ["cpu_only.json.gz", "no_distributed_info.json.gz",
                                  "rank_non_gpu.json.gz"])
def test_negative_traces_say_there_is_no_gpu_activity(traces, name):
    d = diagnose(traces / "negative" / name, jobs=1)
    assert d.device.kind == "cpu"
    assert any("no GPU activity" in w for w in d.warnings)
    # the trace has no GPU, so nothing may be reported as GPU time
    assert all(r.gpu_span is None for r in d.ranks)


def test_negative_folder_says_no_gpu_and_refuses_a_cpu_mfu_for_gpu_flops(traces):
    proc = gpudiag("analyze", str(traces / "negative"))
    assert proc.returncode == 0, proc.stderr
    assert "no GPU activity in the trace" in proc.stdout
    # these ops ran on GPUs: their FLOPs over this CPU's peak would be >100% "MFU"
    assert "MFU: not available" in proc.stdout


def test_unknown_trace_device_warns_and_reports_no_mfu(traces, tmp_path):
    doc = json.loads(gzip.decompress((traces / "mi250" / "rank-0.json.gz").read_bytes()))
    doc["deviceProperties"][0]["name"] = "Imaginary GPU 9000"
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps(doc))
    d = diagnose(p, jobs=1)
    assert d.mfu.value is None and d.mfu.reason.startswith("not available")
    assert any("unknown device Imaginary GPU 9000" in w for w in d.warnings)


def test_trace_without_steps_is_one_window_with_a_warning(traces):
    d = diagnose(traces / "a100-alexnet", jobs=1)
    assert len(d.ranks[0].steps) == 1 and d.ranks[0].steps[0].step is None
    assert any("no ProfilerStep" in w for w in d.warnings)


def test_old_category_names_are_accepted(traces, tmp_path):
    rename = {"kernel": "Kernel", "cuda_runtime": "Runtime", "cpu_op": "Operator",
              "gpu_memcpy": "Memcpy", "gpu_memset": "Memset"}
    doc = json.loads(gzip.decompress((traces / "v100-single" / "rank-0.json.gz").read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") in rename:
            e["cat"] = rename[e["cat"]]
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps(doc))
    new = diagnose(traces / "v100-single", jobs=1).ranks[0].gpu_span
    old = diagnose(p, jobs=1).ranks[0].gpu_span
    assert old == new


def test_run_directory_reads_its_traces_folder(traces, tmp_path):
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    write_run(run, RunInfo(command=["python", "train.py"], cwd=".", host="h", start=0.0, options={},
                           versions={}))
    (run / "traces" / "rank-0.json.gz").write_bytes(
        Path(traces / "mi250" / "rank-0.json.gz").read_bytes())
    assert diagnose(run, jobs=1).ranks[0].rank == 0


def test_torch_trace_with_a_quote_in_an_annotation_is_read_event_by_event(tmp_path):
    # torch writes record_function names containing '"' unescaped: invalid JSON on disk
    script = (
        "import torch, sys\n"
        "with torch.profiler.profile(record_shapes=True) as p:\n"
        "    for _ in range(3):\n"
        "        with torch.autograd.profiler.record_function('load \"shard\"'):\n"
        "            torch.ones(64, 64) @ torch.ones(64, 64)\n"
        "        p.step()\n"
        "p.export_chrome_trace(sys.argv[1])\n")
    out = tmp_path / "rank-0.json"
    subprocess.run([sys.executable, "-c", script, str(out)], check=True, capture_output=True, timeout=120)
    import msgspec

    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(out.read_bytes())  # still the torch behaviour this guards against
    d = diagnose(out, jobs=1)
    assert any("not valid JSON" in w and "dropped" in w for w in d.warnings)
    assert d.verdict.label is not Bottleneck.UNKNOWN
    assert any(t.name == "aten::matmul" and t.calls == 3 for t in d.top_ops)  # nothing else lost


def _mi250_with(traces, tmp_path, change) -> Path:
    doc = json.loads(gzip.decompress((traces / "mi250" / "rank-0.json.gz").read_bytes()))
    change([e for e in doc["traceEvents"] if e.get("cat") == "kernel"], doc["traceEvents"])
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps(doc))
    return p


def test_a_trace_that_lost_its_gpu_events_gets_no_verdict_and_says_why(traces, tmp_path):
    """Every kernel with a negative duration: no GPU time is known, so no label is given (it
    used to read host-bound with confidence 0.95)."""
    def negate(kernels, _):
        for k in kernels:
            k["dur"] = -abs(k.get("dur") or 1)
    d = diagnose(_mi250_with(traces, tmp_path, negate), jobs=1)
    assert d.verdict.label is Bottleneck.UNKNOWN and d.verdict.confidence == 0.0
    assert "GPU events" in d.verdict.summary and "unusable" in d.verdict.summary
    assert any("negative duration" in w for w in d.warnings)
    assert d.mfu.value is None


def test_a_trace_that_lost_a_share_of_its_events_gets_a_lower_confidence(traces, tmp_path):
    before = diagnose(traces / "mi250", jobs=1).verdict

    def drop_some(_, events):
        timed = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "cuda_runtime")]
        for e in timed[: len(timed) // 5]:
            del e["ts"]
    after = diagnose(_mi250_with(traces, tmp_path, drop_some), jobs=1).verdict
    assert after.confidence < before.confidence
    # the deduction says why, and costs what it says
    lost = [x for x in after.deductions if "unusable" in x.reason]
    assert len(lost) == 1 and lost[0].amount > 0
    assert "unusable" not in " ".join(x.reason for x in before.deductions)


def test_an_implausibly_long_kernel_is_dropped_and_counted(traces, tmp_path):
    def forever(kernels, _):
        kernels[0]["dur"] = 1e18
    d = diagnose(_mi250_with(traces, tmp_path, forever), jobs=1)
    assert any("1 events with implausible durations" in w for w in d.warnings)
    b = d.breakdown
    assert b.gpu_busy <= b.step_time  # the 10^18 us kernel did not swallow the step
