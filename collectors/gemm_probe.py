"""Time a job's own GEMM shapes in fp32 and in bf16 as torch.autocast runs them, on this CPU.

The CPU's bf16 peak (``cpu_peak``: the best of 512x512x512 GEMMs) says what bf16 can do, not
what a job's GEMMs get from it: blind set 12 on the 2-core AMD EPYC VM (bf16 peak 2.2x fp32)
measured autocast at 0.715x on two 256x1024x1024 layers (0.50x predicted from the peaks) and
1.08x, slower, on a host-bound MLP of 64x128x256 layers (0.84x predicted). Autocast also casts
each fp32 weight to bf16 at every call, which the peak leaves out. So each shape is timed as
autocast runs it, ``F.linear(x.bfloat16(), w.bfloat16())`` with its casts, against the fp32
``F.linear(x, w)``, on one thread (the pace of one core; a run timed by its own CPU clock, the
best of short runs: ``cpu_peak.best_rate``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from gpudiag.collectors.cpu_peak import best_rate, cache_key, cache_path, thread_clock

# Per shape and dtype, runs go on for this long (at least MIN_RUNS): four shapes in about 1 s.
BUDGET_S = 0.06
MIN_RUNS = 3
# A shape larger than this many FLOPs a call is timed at this size instead (its rows cut): the
# ratio of two large GEMMs settles well before their full size.
MAX_FLOPS = 2e9


def autocast_ratios(shapes: list[tuple[int, int, int]]) -> dict[tuple[int, int, int], float]:
    """``measure_ratios``, each shape measured once per CPU model, core count and library
    versions (the CPU peak's cache key) and kept beside the peak's cache: a report, an analyze
    and a profile of the same job time its shapes once (0.06 s per shape and dtype, about 1 s for
    six shapes on the 2-core AMD EPYC VM)."""
    path = cache_path().with_name("gemm_autocast.json")
    key = cache_key()
    cached = _read(path, key)
    missing = [s for s in shapes if _name(s) not in cached]
    if missing:
        cached.update({_name(s): r for s, r in measure_ratios(missing).items()})
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({**key, "ratios": cached}))
            tmp.replace(path)
        except OSError:
            pass  # an unwritable cache only costs a measurement next time
    return {s: float(cached[_name(s)]) for s in shapes if _name(s) in cached}


def _name(s: tuple[int, int, int]) -> str:
    return "x".join(str(d) for d in s)


def _read(path: Any, key: dict[str, Any]) -> dict[str, float]:
    """The cached ratios for this key; a file that is not this key's, or not ours, gives none."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or any(data.get(k) != v for k, v in key.items()):
        return {}
    ratios = data.get("ratios")
    if not isinstance(ratios, dict):
        return {}
    return {k: float(v) for k, v in ratios.items()
            if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e3}


def measure_ratios(shapes: list[tuple[int, int, int]]) -> dict[tuple[int, int, int], float]:
    """Per (rows, inner, out) shape: the time of its GEMM in bf16 with autocast's casts over
    its time in fp32, on one thread. Shapes this build cannot run in bf16 are left out."""
    try:
        import torch
        import torch.nn.functional as F  # noqa: N812
    except ImportError:
        return {}
    out: dict[tuple[int, int, int], float] = {}
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for m, k, n in shapes:
            rows = max(1, min(m, int(MAX_FLOPS / max(2.0 * k * n, 1.0))))
            x, w = torch.randn(rows, k), torch.randn(n, k)
            work = 2.0 * rows * k * n
            def fp32_op(x: torch.Tensor = x, w: torch.Tensor = w) -> torch.Tensor:
                return F.linear(x, w)

            def bf16_op(x: torch.Tensor = x, w: torch.Tensor = w) -> torch.Tensor:
                return F.linear(x.bfloat16(), w.bfloat16())   # autocast's casts, then the GEMM

            with torch.no_grad():
                fp32 = _rate(fp32_op, work)
                try:
                    bf16 = _rate(bf16_op, work)
                except RuntimeError:  # a build without bf16 GEMMs on this CPU
                    continue
            if fp32 > 0 and bf16 > 0:
                out[(m, k, n)] = fp32 / bf16
    finally:
        torch.set_num_threads(before)
    return out


def _rate(op: Callable[[], object], work: float) -> float:
    op()  # the first call picks and warms the kernel
    return best_rate(op, work, budget_s=BUDGET_S, min_runs=MIN_RUNS, clock=thread_clock)
