"""The job's own GEMM shapes timed in bf16 with autocast's casts (``analyzers.autocast_gemms``,
``collectors.gemm_probe``): blind set 12 measured autocast at 0.715x on two 256x1024x1024 layers
and 1.08x, slower, on a host-bound MLP of 64x128x256 layers, where the bf16 peak's ratio (2.2x)
had promised 0.50x and 0.84x."""

from __future__ import annotations

import json

import pytest

from gpudiag.analyzers import whatif
from gpudiag.analyzers.autocast_gemms import TOP_SHAPES, gemm_shapes, summarise
from gpudiag.collectors.gemm_probe import autocast_ratios
from gpudiag.contract import ENV_CACHE_DIR
from gpudiag.diagnosis import TimeBreakdown


def test_the_fp32_gemm_groups_give_rows_inner_out_and_their_time_merged_per_shape():
    groups = {
        ("aten::addmm", "[[1024], [256, 1024], [1024, 1024], [], []]", "float"): [4, 0, 0, 900.0],
        ("aten::mm", "[[256, 1024], [1024, 1024]]", "float"): [4, 0, 0, 100.0],   # the same shape
        ("aten::mm", "[[1024, 256], [256, 1024]]", "float"): [4, 0, 0, 500.0],
        ("aten::mm", "[[64, 32], [32, 16]]", "c10::BFloat16"): [4, 0, 0, 9e9],    # not fp32
        ("aten::bmm", "[[4, 8, 8], [4, 8, 8]]", "float"): [4, 0, 0, 9e9],         # not timed
        ("aten::mm", "[[3, 4], [5, 6]]", "float"): [1, 0, 0, 9e9],                # inner dims differ
        ("aten::mm", "not json", "float"): [1, 0, 0, 9e9],
        ("aten::mm", "[[true, 4], [4, 6]]", "float"): [1, 0, 0, 9e9],
    }
    assert gemm_shapes(groups) == [((256, 1024, 1024), 1000.0), ((1024, 256, 1024), 500.0)]
    many = {("aten::mm", f"[[{i}, 8], [8, 8]]", "float"): [1, 0, 0, float(i)] for i in range(1, 20)}
    assert [s for s, _ in gemm_shapes(many)] == [(i, 8, 8) for i in range(19, 19 - TOP_SHAPES, -1)]


def test_the_measured_ratio_is_weighted_by_each_shapes_time_over_the_compute_bound_work():
    shapes = [((256, 1024, 1024), 3000.0), ((64, 128, 256), 1000.0), ((8, 8, 8), 50.0)]
    got = summarise(shapes, {(256, 1024, 1024): 0.5, (64, 128, 256): 1.1}, compute_bound_us=8000.0)
    assert got is not None and got.shapes == 2
    assert got.ratio == pytest.approx((3000 * 0.5 + 1000 * 1.1) / 4000)
    assert got.share == pytest.approx(0.5)
    assert summarise(shapes, {}, 8000.0) is None
    # a shape under MIN_SHARE of the compute-bound time is no figure for the step
    assert summarise([((8, 8, 8), 50.0)], {(8, 8, 8): 4.6}, 8000.0) is None
    assert summarise(shapes, {(8, 8, 8): 0.5}, 0.0) is None


def test_the_timed_gemms_take_their_measured_ratio_and_the_rest_the_peaks():
    b = TimeBreakdown(step_time=10e3, compute=8e3, compute_bound=8e3, idle=2e3, host_overhead=2e3)
    p = whatif.faster_dtype_measured(b, 1.0, peak_ratio=0.45, measured=1.05, share=0.5, shapes=3)
    assert p.step_us == pytest.approx(10e3 - (4e3 * (1 - 1.05) + 4e3 * (1 - 0.45)))
    assert "1.05x their fp32 time" in p.why and "3 largest GEMM shapes" in p.why
    slower = whatif.faster_dtype_measured(b, 1.0, peak_ratio=0.45, measured=1.2, share=1.0, shapes=1)
    assert slower.step_us > b.step_time   # then recommend lists it as one that would not help


def test_the_probe_times_each_shape_on_this_cpu_once_and_keeps_a_hostile_cache_out(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path))
    shapes = [(64, 128, 256), (32, 64, 64)]
    got = autocast_ratios(shapes)
    # a torch build without bf16 GEMMs leaves shapes out; this project's CPUs all run them
    assert set(got) == set(shapes)
    assert all(0.05 < r < 50 for r in got.values()), got
    cache = tmp_path / "gemm_autocast.json"
    data = json.loads(cache.read_text())
    assert set(data["ratios"]) == {"64x128x256", "32x64x64"}
    # read back, not timed again: a planted figure is what comes back
    data["ratios"]["64x128x256"] = 0.123
    cache.write_text(json.dumps(data))
    assert autocast_ratios(shapes[:1]) == {(64, 128, 256): 0.123}
    # hostile or foreign content is no figure: it is measured afresh
    for bad in ("not json", json.dumps([1]), json.dumps({**data, "ratios": {"64x128x256": True}}),
                json.dumps({**data, "version": -1})):
        cache.write_text(bad)
        again = autocast_ratios(shapes[:1])
        assert set(again) == {(64, 128, 256)} and again[(64, 128, 256)] != 0.123, (bad, again)
