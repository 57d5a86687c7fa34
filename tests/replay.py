"""Replay backends for tests: real H200 readings, through the live sampler/collector path."""

from __future__ import annotations

from pathlib import Path

from gpudiag.collectors.nvml import ReplayBackend

H200_SAMPLES = Path(__file__).parent / "fixtures" / "h200" / "profile_gemm_gpu.jsonl"


class GpuFallsOffTheBus(ReplayBackend):
    """Two GPUs replaying the same real recording; GPU 1 stops answering after
    ``good_reads`` reads, as a GPU lost to an Xid 79 does."""

    def __init__(self, good_reads: int, path: Path = H200_SAMPLES) -> None:
        super().__init__(path)
        self.good_reads = good_reads
        self.rows = [self.rows[0], list(self.rows[0])]
        self.pos = [0, 0]

    def sample(self, index: int) -> dict:
        if index == 1 and self.pos[1] >= self.good_reads:
            raise RuntimeError("Unknown Error (GPU is lost)")
        return super().sample(index)
