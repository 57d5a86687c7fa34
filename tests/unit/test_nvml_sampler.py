"""The GPU sampler, fed by replayed real H200 readings through the live code path."""

from __future__ import annotations

import json
import time

import pytest

from gpudiag.collectors.nvml import (
    GPM_MIN_INTERVAL_S,
    NO_BACKEND_REASON,
    NvmlBackend,
    NvmlUnavailable,
    ReplayBackend,
    Sampler,
    check_backend_spec,
    open_backend,
    read_samples,
)
from tests.paths import TESTS
from tests.replay import GpuFallsOffTheBus

H200 = TESTS / "fixtures" / "h200"


def test_live_nvml_reads_every_gpu_or_says_why_in_nvmls_own_words():
    """Whichever this host is. With NVML: every GPU answers a sample (real memory size, a
    GPM pair that survives two reads). Without: NvmlUnavailable carries one of NVML's own
    error strings, not a traceback or a paraphrase."""
    import pynvml as nv

    nvml_words = {str(nv.NVMLError(getattr(nv, k))) for k in dir(nv) if k.startswith("NVML_ERROR_")}
    try:
        backend = NvmlBackend()
    except NvmlUnavailable as e:
        assert str(e) in nvml_words
        return
    try:
        assert backend.gpu_count() >= 1
        for i, meta in enumerate(backend.describe()):
            assert str(meta["uuid"]).startswith(("GPU-", "MIG-"))
            time.sleep(GPM_MIN_INTERVAL_S * 1.5)  # one GPM window NVML will compute
            row = backend.sample(i)
            assert isinstance(row["mem_total"], int) and row["mem_total"] > 0, row
            if meta["gpm"]:
                gpm = {k: v for k, v in row.items() if k.startswith("gpm_")}
                assert any(isinstance(v, float) for v in gpm.values()), row
                # a read right after (a second scraper) gets that window, not a ~0 ms one
                again = backend.sample(i)
                assert {k: v for k, v in again.items() if k.startswith("gpm_")} == gpm
    finally:
        backend.close()


def test_backend_none_is_the_no_nvml_path_and_bad_specs_are_refused():
    with pytest.raises(NvmlUnavailable) as e:
        open_backend("none")
    assert str(e.value) == NO_BACKEND_REASON
    for bad in ("nvm", "replay:", "NONE", ""):
        with pytest.raises(ValueError, match="unknown GPU backend"):
            check_backend_spec(bad)


def test_replay_of_a_real_recording_yields_its_rows_in_order():
    rec = [json.loads(x) for x in (H200 / "profile_gemm_gpu.jsonl").read_text().splitlines()[1:]]
    backend = ReplayBackend(H200 / "profile_gemm_gpu.jsonl")
    assert backend.gpu_count() == 1 and backend.describe()[0]["gpm"] is True
    for want in rec[:5]:
        got = backend.sample(0)
        assert got["sm_clock_mhz"] == want["sm_clock_mhz"] and got["power_mw"] == want["power_mw"]


def test_a_gpu_falling_off_the_bus_keeps_the_others_sampled(tmp_path):
    out = tmp_path / "gpu.jsonl"
    s = Sampler(GpuFallsOffTheBus(good_reads=3), out, interval=0.02).start()
    time.sleep(0.4)
    stats = s.stop()
    rows = read_samples(out)
    gpu0 = [r for r in rows if r["gpu"] == 0]
    gpu1 = [r for r in rows if r["gpu"] == 1]
    assert len(gpu0) >= 8 and all("error" not in r for r in gpu0)
    assert [("error" in r) for r in gpu1[:4]] == [False, False, False, True]
    assert stats.errors == len(gpu1) - 3


def test_a_torn_last_line_loses_only_that_line(tmp_path):
    out = tmp_path / "gpu.jsonl"
    s = Sampler(ReplayBackend(H200 / "profile_gemm_gpu.jsonl"), out, interval=0.02).start()
    time.sleep(0.2)
    s.stop()
    whole = read_samples(out)
    with out.open("a") as f:
        f.write('{"t": 1.0, "gpu": 0, "power_mw": 12')  # the crash mid-write
    assert read_samples(out) == whole


@pytest.mark.parametrize("content,needle", [
    ("", "no samples"),
    ("not json\n", "not JSON"),
    ('{"t": 1}\n', "no 'gpu'"),
])
def test_bad_replay_files_are_refused_with_the_reason(tmp_path, content, needle):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(NvmlUnavailable, match=needle):
        ReplayBackend(p)
