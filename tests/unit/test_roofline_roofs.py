"""No roofline point above a roof: a point above the compute or bandwidth roof is a counting bug.

FLOPs are model FLOPs and bytes lower bounds (``analyzers/op_flops.py``), so an op drawn
above its dtype's peak or above the memory bandwidth was over-counted (ResNet-50's stride-2
stem counted at 4x its FLOPs drew a point at 1.6 PFLOP/s on a 989 TFLOP/s H100). Every real
GPU trace we hold is walked; at run time the same check is a warning naming the op.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudiag.analyzers.diagnose import DeviceChoice, diagnose
from gpudiag.analyzers.roofline import RooflineAcc, roof_violations, work_bounds
from gpudiag.analyzers.trace_loader import find_trace_files, load_rank
from gpudiag.devices import DevicePeak, match_device
from tests.conftest import (
    GPU_TRACE_DIRS,
    SHARED,  # one place decides where test data is
    TRACES,
)
from tests.paths import TESTS

RUNS = SHARED / "runs"
FIXTURES = TESTS / "fixtures" / "h200"
TRACE_DIRS = (
    [TRACES / d for d in GPU_TRACE_DIRS]
    + sorted(p for p in RUNS.iterdir() if (p / "traces").is_dir())
    + sorted(p for p in FIXTURES.iterdir() if p.is_dir() and p.name != "runs")
    + sorted(p for p in (FIXTURES / "runs").iterdir() if (p / "traces").is_dir())
)


def _acc(path: Path) -> tuple[RooflineAcc, DevicePeak | None]:
    rt = load_rank(path)
    device = match_device(rt.device_name) if rt.device_name else None
    acc = RooflineAcc()
    acc.add(rt, work_bounds(rt, device))
    return acc, device


@pytest.mark.parametrize("target", TRACE_DIRS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_point_above_a_roof(target):
    for f in find_trace_files(target):
        acc, device = _acc(f)
        assert roof_violations(acc, device) == []


def test_the_walk_checks_real_points():
    # the walk must hold costed work against a known device, or it proves nothing
    checked = {}
    for target in TRACE_DIRS:
        for f in find_trace_files(target):
            acc, device = _acc(f)
            if device is not None:
                checked[target.name] = len(acc.groups)
    assert {"h100-gpt-small", "h100-resnet18-dl8", "gemm_bf16", "a100-8rank-diff"} <= set(checked)
    assert all(checked[k] > 10 for k in ("h100-gpt-small", "h100-resnet18-dl8"))


def test_an_over_counted_strided_convolution_is_named():
    # ResNet-18's stride-2 3x3 convolution into layer 3 (28x28 in, 14x14 out) as the old
    # shape-preserving guess counted it: output as large as the input, 4x its FLOPs
    acc, device = _acc(RUNS / "h100-resnet18-dl8" / "traces" / "rank-0.json.gz")
    conv = [k for k in acc.groups if k[0] == "aten::cudnn_convolution"
            and k[1].startswith("[[128, 128, 28, 28], [256, 128, 3, 3]")]
    assert len(conv) == 1
    assert roof_violations(acc, device) == []
    acc.groups[conv[0]][1] *= (28 * 28) / (14 * 14)
    (warning,) = roof_violations(acc, device)
    assert warning.startswith("roofline: aten::cudnn_convolution [[128, 128, 28, 28], [256, 128, 3, 3]")
    assert "above the 989.4 TFLOP/s bf16 peak" in warning


def test_diagnosis_warns_about_a_point_above_the_roof():
    # the H200 GEMMs run at ~700 TFLOP/s: against a claimed 100 TFLOP/s peak every one of them
    # sits above the compute roof, and the diagnosis says which op
    d = diagnose(FIXTURES / "gemm_bf16", DeviceChoice(peak_tflops=100, peak_gbps=4800), jobs=1)
    above = [w for w in d.warnings if w.startswith("roofline: ")]
    assert above and all("aten::mm" in w and "above the 100 TFLOP/s" in w for w in above)
    honest = diagnose(FIXTURES / "gemm_bf16", jobs=1)
    assert not [w for w in honest.warnings if w.startswith("roofline: ")]
