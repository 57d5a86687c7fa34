"""The Diagnosis is a contract: JSON round trip, versioning, and the numbers adding up."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from gpudiag.analyzers.diagnose import DeviceChoice, diagnose
from gpudiag.devices import DEVICE_TABLE, lookup_device, match_device
from gpudiag.diagnosis import Diagnosis
from gpudiag.errors import BadInput


@pytest.fixture(scope="module")
def nccl_diagnosis(traces) -> Diagnosis:
    return diagnose(traces / "a100-nccl-2rank", jobs=1)


def test_diagnosis_round_trips_through_json(nccl_diagnosis):
    again = Diagnosis.from_json(nccl_diagnosis.to_json())
    assert again.to_dict() == nccl_diagnosis.to_dict()


def test_unknown_schema_version_is_refused(nccl_diagnosis):
    data = nccl_diagnosis.to_dict()
    data["schema_version"] = 99
    with pytest.raises(BadInput, match="schema version 99"):
        Diagnosis.from_dict(data)


def test_step_parts_add_up_to_step_time(traces):
    for folder in ("a100-nccl-2rank", "v100-ddp-2rank", "a100-8rank-diff"):
        for rank in diagnose(traces / folder, jobs=1).ranks:
            for s in rank.steps:
                b = s.breakdown
                parts = b.compute + b.comm_exposed + b.memcpy_exposed + b.idle
                assert parts == pytest.approx(b.step_time, rel=1e-9, abs=1e-6)
                assert b.idle == pytest.approx(b.input_wait + b.host_overhead)
                assert b.compute_bound + b.memory_bound <= b.compute + 1e-6


def test_nccl_allreduce_bandwidth_uses_nccl_tests_formula(nccl_diagnosis):
    ar = next(c for c in nccl_diagnosis.communication if c.collective == "all_reduce")
    assert ar.count == 15
    # 2 ranks: busbw = algbw * 2(n-1)/n = algbw
    assert ar.busbw_gbps == pytest.approx(ar.algbw_gbps)
    assert 0 < ar.exposed_time_us <= ar.total_time_us


def test_shapes_give_a_roofline_and_mfu(traces):
    d = diagnose(traces / "a100-8rank-diff", jobs=1)
    assert d.roofline.method == "shapes"
    assert d.roofline.points and all(p.intensity > 0 for p in d.roofline.points)
    assert d.mfu.value is not None and 0 < d.mfu.value < 1
    assert d.mfu.flops_source == "shapes"


def test_flops_per_step_option_overrides_shapes(traces):
    d = diagnose(traces / "v100-single", DeviceChoice(name="V100-SXM2"), flops_per_step=1e12, jobs=1)
    # the step's wall time straight from the trace's ProfilerStep spans, not gpudiag's own number
    [trace] = list((traces / "v100-single").glob("*.json*"))
    raw = trace.read_bytes()
    doc = json.loads(gzip.decompress(raw) if trace.name.endswith(".gz") else raw)
    steps = [e["dur"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("ph") == "X"]
    step_s = sum(steps) / len(steps) * 1e-6
    assert d.mfu.value == pytest.approx(1e12 / step_s / 15.7e12, rel=0.01)


def test_missing_shapes_mean_no_mfu_and_a_warning(traces):
    d = diagnose(traces / "v100-ddp-2rank", jobs=1)
    assert d.mfu.value is None and "record_shapes" in d.mfu.reason
    assert d.roofline.method == "kernel-names"
    assert any("no operator shapes" in w for w in d.warnings)


def test_every_table_device_resolves_and_trace_names_match():
    for name, dev in DEVICE_TABLE.items():
        assert lookup_device(name) is dev
        assert dev.bandwidth > 0 and dev.flops["fp32"] > 0
    assert match_device("NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert match_device("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert match_device("AMD Instinct MI250X").name == "MI250X"
    assert match_device("Tesla V100-SXM2-16GB").name == "V100-SXM2"
    assert match_device("NVIDIA H200").name == "H200"
    assert match_device("Quantum GPU") is None


def test_cli_json_is_the_full_diagnosis(traces):
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", str(traces / "mi250"), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert Diagnosis.from_dict(data).verdict.label.value == data["verdict"]["label"]


def test_cli_help_teaches_usage():
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for needle in ("--json", "--device", "--peak-tflops", "--flops-per-step", "Examples"):
        assert needle in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "frobnicate"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2


def test_a_job_mixing_dtypes_is_judged_against_the_mix(traces):
    """fp32 matmuls that ran as TF32 on the A100's tensor cores, and a few that did not: the
    peak is the time the FLOPs would take, each family at its own datasheet peak."""
    d = diagnose(traces / "a100-8rank-diff", jobs=1)
    mix = d.mfu.dtype_mix
    assert d.mfu.dtype_family == "mixed" and set(mix) == {"tf32", "fp32"}, mix
    assert sum(mix.values()) == pytest.approx(1.0)
    a100 = lookup_device("A100-40GB").flops
    expected = 1 / (mix["tf32"] / a100["tf32"] + mix["fp32"] / a100["fp32"])
    assert d.mfu.peak_flops == pytest.approx(expected)
    assert a100["fp32"] < d.mfu.peak_flops < a100["tf32"]
    assert "peak of the mix (tf32" in d.mfu.reason
