"""Advice to run in fp32 a job that runs its matmuls in a precision its device does slower: a
lower one (torch.autocast to bf16 or fp16) on a device whose measured peak for it is below its
fp32 one, or float64 (a model or its inputs left in double: numpy's default dtype). A CPU without
bf16/fp16 units converts each operand to fp32 and back around every operation (the held-out zoo's
bf16_autocast job ran 0.12x the time in fp32 on this project's 2-core AMD EPYC, whose bf16 GEMM
peak is ~9 GFLOP/s against fp32 ~90-135); its float64 GEMMs run at 43 GFLOP/s against fp32's 93
on one core (the third blind zoo's fp64_mlp: read compute-bound at MFU 39% of the fp32 peak, told
only to do fewer FLOPs, where fp32 ran 0.37-0.49x the step). The catalogue elsewhere only moves
*to* lower precision; this is the way back, priced by the two peaks. The price is a floor on
the gain: only the compute-bound work is moved by the peaks' ratio, while the casts and the
memory-bound work in bf16 also go (the zoo job at load 15: -3% predicted, its fp32 run
0.12x on an earlier measurement)."""

from __future__ import annotations

from gpudiag.analyzers import whatif
from gpudiag.analyzers.advice_inputs import AdviceInputs, device_unit
from gpudiag.diagnosis import Bottleneck
from gpudiag.units import ms, pct_whole

LOWER = ("bf16", "fp16")
# The families run in fp32 instead where the device does them slower: the lower ones, and fp64
SLOWER = (*LOWER, "fp64")
# Work in such a family worth the change: at least half the model FLOPs (as ``fp32_share`` for
# the move the other way).
LOWER_SHARE_MIN = 0.5
# fp32 must be at least this much faster than the lower family to be worth the change (the
# same bar as a faster dtype, ``advice_inputs.FASTER_DTYPE_MIN_RATIO``).
SLOWER_MIN_RATIO = 1.5


def slower_lower(a: AdviceInputs) -> tuple[str, float, float] | None:
    """(family, its share of the model FLOPs, peak_family / peak_fp32) of the family in SLOWER
    most of the job's FLOPs ran in, where its measured peak is below fp32's by at least
    ``SLOWER_MIN_RATIO``; None otherwise."""
    fp32 = a.device_peaks.get("fp32")
    mix = a.mfu.dtype_mix or {}
    if not fp32 or not mix:
        return None
    fam = max(SLOWER, key=lambda f: mix.get(f, 0.0))
    share, peak = mix.get(fam, 0.0), a.device_peaks.get(fam)
    if share < LOWER_SHARE_MIN or not peak or fp32 < SLOWER_MIN_RATIO * peak:
        return None
    return fam, share, peak / fp32


def applies(a: AdviceInputs, s: dict[Bottleneck, float]) -> bool:
    return a.view.compute_bound > 0 and slower_lower(a) is not None


def predict(a: AdviceInputs) -> whatif.Prediction:
    """The compute-bound work of the lower family at the fp32 peak: its time times
    peak_family / peak_fp32."""
    found = slower_lower(a)
    assert found is not None
    fam, share, ratio = found
    part = a.view.compute_bound * share
    saved = part * (1 - ratio)
    rest = ("nor from the memory-bound work's bytes, half of them in fp32" if fam == "fp64" else
            "nor from the memory-bound work run in the lower precision, which a device without its "
            "units also runs slower")
    return whatif.Prediction(
        a.view.step_time - saved,
        f"compute-bound {fam} work ({ms(part)}) at the fp32 peak, {1 / ratio:.2g}x the {fam} one; "
        "assumes the same efficiency (share of the peak) in both dtypes; a floor on the gain: it "
        f"counts nothing from the casts autocast no longer does {rest}")


def text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    found = slower_lower(a)
    assert found is not None
    fam, share, ratio = found
    fp32 = a.device_peaks["fp32"]
    how, fix = (("float64 (a model or inputs left in double: numpy's default)",
                 "cast the model and its inputs to float32 (model.float(), torch.from_numpy(x).float())")
                if fam == "fp64" else ("torch.autocast", "drop the autocast"))
    return (f"{pct_whole(share)} of the model FLOPs run in {fam} ({how}), on a "
            f"{device_unit(a)} whose measured {fam} GEMM peak is {fp32 * ratio / 1e9:.3g} GFLOP/s against "
            f"fp32 {fp32 / 1e9:.3g} ({ratio:.2g}x): run in fp32 ({fix}), whose matmuls "
            "this device does faster.")
