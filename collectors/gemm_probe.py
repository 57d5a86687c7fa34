"""Time a job's own Linear layers and GEMM shapes in fp32 and in bf16 as torch.autocast runs
them, on this CPU.

The CPU's bf16 peak (``cpu_peak``: the best of 512x512x512 GEMMs) says what bf16 can do, not
what a job's GEMMs get from it: blind set 12 on the 2-core AMD EPYC VM (bf16 peak 2.2x fp32)
measured autocast at 0.715x on two 256x1024x1024 layers (0.50x predicted from the peaks) and
1.08x, slower, on a host-bound MLP of 64x128x256 layers (0.84x predicted). Autocast also casts
each fp32 weight to bf16 at every call, which the peak leaves out, and casts each weight's
gradient back to fp32 in the backward, which timing the GEMMs alone leaves out (a 6 x
Linear(384) MLP at batch 16: its GEMMs alone 0.68x, the layer 0.84-0.94x, the job 1.00x). So a
layer (``analyzers.autocast_gemms``: a forward GEMM with its two backward ones) is timed
whole, ``F.linear(x, w, b)`` and its backward under ``torch.autocast('cpu', bfloat16)`` against
the same in fp32; a lone GEMM as autocast runs it, ``F.linear(x.bfloat16(), w.bfloat16())``,
against ``F.linear(x, w)``. One thread (the pace of one core), each timed by its own CPU clock,
the best of short runs (``cpu_peak.best_rate``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from gpudiag.collectors.cpu_peak import best_rate, cache_key, cache_path, thread_clock

# (kind, rows, inner, out), as analyzers.autocast_gemms names them
Probe = tuple[str, int, int, int]

# Per probe and dtype, runs go on for this long (at least MIN_RUNS): six probes in about 1 s.
BUDGET_S = 0.06
MIN_RUNS = 3
# A probe larger than this many FLOPs a call (a layer: its three GEMMs) is timed at this size
# instead (its rows cut): the ratio of two large GEMMs settles well before their full size.
MAX_FLOPS = 2e9


def autocast_ratios(probes: list[Probe]) -> dict[Probe, float]:
    """``measure_ratios``, each probe measured once per CPU model, core count and library
    versions (the CPU peak's cache key) and kept beside the peak's cache: a report, an analyze
    and a profile of the same job time its layers once (0.06 s per probe and dtype, about 1 s
    for six on the 2-core AMD EPYC VM)."""
    path = cache_path().with_name("gemm_autocast.json")
    key = cache_key()
    cached = _read(path, key)
    missing = [p for p in probes if _name(p) not in cached]
    if missing:
        cached.update({_name(p): r for p, r in measure_ratios(missing).items()})
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({**key, "ratios": cached}))
            tmp.replace(path)
        except OSError:
            pass  # an unwritable cache only costs a measurement next time
    return {p: float(cached[_name(p)]) for p in probes if _name(p) in cached}


def _name(p: Probe) -> str:
    dims = "x".join(str(d) for d in p[1:])
    return dims if p[0] == "gemm" else f"{p[0]}:{dims}"


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


def measure_ratios(probes: list[Probe]) -> dict[Probe, float]:
    """Per probe: its time in bf16 as autocast runs it over its time in fp32, on one thread.
    Probes this build cannot run in bf16 (or does not know) are left out."""
    try:
        import torch
    except ImportError:
        return {}
    out: dict[Probe, float] = {}
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for probe in probes:
            ops = _layer_ops(probe) if probe[0].startswith("linear") else _gemm_ops(probe)
            if ops is None:
                continue
            fp32_op, bf16_op, work = ops
            try:
                fp32 = _rate(fp32_op, work)
                bf16 = _rate(bf16_op, work)
            except RuntimeError:  # a build without bf16 GEMMs on this CPU
                continue
            if fp32 > 0 and bf16 > 0:
                out[probe] = fp32 / bf16
    finally:
        torch.set_num_threads(before)
    return out


_Ops = tuple[Callable[[], object], Callable[[], object], float]


def _rows(m: int, k: int, n: int, gemms: int) -> int:
    return max(1, min(m, int(MAX_FLOPS / max(2.0 * gemms * k * n, 1.0))))


def _gemm_ops(probe: Probe) -> _Ops | None:
    import torch
    import torch.nn.functional as F  # noqa: N812

    _kind, m, k, n = probe
    rows = _rows(m, k, n, 1)
    x, w = torch.randn(rows, k), torch.randn(n, k)

    def fp32_op() -> object:
        with torch.no_grad():
            return F.linear(x, w)

    def bf16_op() -> object:
        with torch.no_grad():
            return F.linear(x.bfloat16(), w.bfloat16())   # autocast's casts, then the GEMM
    return fp32_op, bf16_op, 2.0 * rows * k * n


def _layer_ops(probe: Probe) -> _Ops | None:
    """A Linear layer's forward and backward: the gradient from the next layer comes in the
    output's dtype (bf16 under autocast), the weight's gradient goes back to fp32."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    kind, m, k, n = probe
    flags = set(kind.split("+")[1:])
    if kind.split("+")[0] != "linear" or not flags <= {"b", "x"}:
        return None
    rows = _rows(m, k, n, 3)
    w = torch.randn(n, k, requires_grad=True)
    b = torch.randn(n, requires_grad=True) if "b" in flags else None
    x = torch.randn(rows, k, requires_grad="x" in flags)
    g32 = torch.randn(rows, n)
    g16 = g32.bfloat16()
    leaves = [t for t in (w, b, x) if t is not None and t.requires_grad]

    def fp32_op() -> object:
        for t in leaves:
            t.grad = None
        F.linear(x, w, b).backward(g32)
        return None

    def bf16_op() -> object:
        for t in leaves:
            t.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = F.linear(x, w, b)
        y.backward(g16)
        return None
    return fp32_op, bf16_op, 2.0 * rows * k * n * (3 if "x" in flags else 2)


def _rate(op: Callable[[], object], work: float) -> float:
    op()  # the first call picks and warms the kernel
    return best_rate(op, work, budget_s=BUDGET_S, min_runs=MIN_RUNS, clock=thread_clock)
