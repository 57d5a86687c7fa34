"""The job's own Linear layers and GEMM shapes, and what bf16 autocast measured on them
(``collectors.gemm_probe``).

``lower-precision`` on a CPU took the compute-bound fp32 work at the bf16 peak's ratio (the
best of 512x512x512 GEMMs), "assuming the same efficiency in both dtypes". Blind set 12 (2-core
AMD EPYC, bf16 peak 2.2x fp32): two 256x1024x1024 layers measured 0.715x with autocast where
0.50x was promised, and a host-bound MLP of 64x128x256 layers ran 1.08x, slower, promised
0.84x. A GEMM's bf16 rate depends on its shape, and autocast casts each weight at every call.
So the fp32 GEMMs that take the most time were timed at their own shapes, with autocast's casts.

Timing each GEMM alone still promised too much where a layer's backward is a large share
(2026-12-02, same VM, one thread, a 6 x Linear(384) MLP at batch 16: its GEMMs 0.68x, the job
1.00x; 4 x Linear(512) at batch 8, memory-bound: halved bytes promised 0.67x, measured 0.96x):
under autocast the weight's gradient comes out of a bf16 GEMM and is cast back to fp32 for the
fp32 weight, and the weight-gradient GEMM of a small batch (inner dimension = the batch) is
mostly that output. So the GEMMs are read as the layers they come from: a forward GEMM
(``addmm``: rows x inner -> out) with its input-gradient GEMM (rows x out -> inner) and its
weight-gradient GEMM (out x rows -> inner), and the probe times the whole layer, forward and
backward, as autocast runs it (``collectors.gemm_probe``); a GEMM that is no layer's is timed
alone, as before. Whatever the roofline called them (a small batch's GEMMs are memory-bound),
a layer's GEMMs take the layer's measured ratio: autocast changes them all. Pure functions: the
timing is the collector's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# The probes timed: the fp32 layers and lone GEMM shapes with the most time, up to this many.
TOP_SHAPES = 6
# ...each at least this share of the costed GEMM, compute- and memory-bound time: a conv net's
# classifier head (0.05 ms of 25, blind set 13) is no figure for the step, and its 4.6x in bf16
# read as if bf16 were a loss.
MIN_SHARE = 0.05
_GEMMS = {"aten::mm": (0, 1), "aten::addmm": (1, 2)}
Shape = tuple[int, int, int]
# What the probe times, with (rows, inner, out): ("gemm", ...) one GEMM alone; ("linear", ...) a
# Linear layer's forward and backward, "linear+b" with a bias, "+x" where its input needs a
# gradient (every layer but the first: the input-gradient GEMM was traced).
Probe = tuple[str, int, int, int]


@dataclass(frozen=True)
class GemmWork:
    """One layer's GEMMs (or a lone GEMM shape's), as traced: the time the roofline called
    compute-bound and memory-bound, and the bytes of the latter."""

    probe: Probe
    cb_us: float
    mb_us: float
    mb_bytes: float

    @property
    def time_us(self) -> float:
        return self.cb_us + self.mb_us


@dataclass(frozen=True)
class AutocastGemms:
    """The measured ratios over the timed GEMMs' time, and their shares of the compute-bound
    and the memory-bound fp32 work (as traced)."""

    ratio: float  # bf16 with casts over fp32, time-weighted over the timed compute-bound GEMMs
    share: float  # the timed compute-bound GEMMs' time over the compute-bound time
    shapes: int   # probes timed (layers and lone shapes)
    mem_ratio: float = 1.0  # the same over the timed memory-bound GEMMs (a small batch's)
    mem_share: float = 0.0  # their time over the memory-bound time
    mem_bytes_share: float = 0.0  # their bytes over all memory-bound fp32 bytes
    layers: int = 0  # of ``shapes``, whole layers


def gemm_work(groups: dict[tuple[str, str, str], list[float]], ridge: float | None) -> list[GemmWork]:
    """The fp32 GEMM groups (the roofline's: (op, shape text, dtype) -> [calls, flops, bytes,
    time]) read as layers, most time first, up to ``TOP_SHAPES``. A layer is a forward
    ``addmm`` (rows x inner -> out; or an ``mm`` whose weight-gradient GEMM was traced) with its
    input-gradient ``mm`` (rows x out x inner) and weight-gradient ``mm`` (out x rows x
    inner); a GEMM no layer claims is a lone shape. ``ridge``: the fp32 FLOP/byte below which a
    group is memory-bound (None: all compute-bound)."""
    entries: list[tuple[str, Shape, float, float, bool]] = []
    for (op, shape, dtype), (_calls, flops, nbytes, time_us) in groups.items():
        if op not in _GEMMS or dtype != "float":
            continue
        s = _parse(shape, *_GEMMS[op])
        if s is not None:
            mem = ridge is not None and nbytes > 0 and flops / nbytes < ridge
            entries.append((op, s, float(time_us), float(nbytes), mem))
    mms: dict[Shape, list[int]] = {}
    for i, (op, s, *_rest) in enumerate(entries):
        if op == "aten::mm":
            mms.setdefault(s, []).append(i)
    claimed: set[int] = set()
    works: list[GemmWork] = []

    def take(shape: Shape) -> list[int]:
        got = [j for j in mms.get(shape, []) if j not in claimed]
        claimed.update(got)
        return got

    order = sorted(range(len(entries)), key=lambda i: (entries[i][0] != "aten::addmm", -entries[i][2]))
    for i in order:
        op, (m, k, n), *_rest = entries[i]
        if i in claimed or (op != "aten::addmm" and not any(
                j not in claimed and j != i for j in mms.get((n, m, k), []))):
            continue
        claimed.add(i)
        wgrad, xgrad = take((n, m, k)), take((m, n, k))
        # a square layer's gradient GEMMs share one shape and one group: its input is taken to
        # need a gradient (every layer but the first)
        x = bool(xgrad) or (m, n, k) == (n, m, k) or (op == "aten::mm" and n == k)
        kind = "linear" + ("+b" if op == "aten::addmm" else "") + ("+x" if x else "")
        works.append(_work((kind, m, k, n), [entries[j] for j in [i, *wgrad, *xgrad]]))
    lone: dict[Shape, list[tuple[str, Shape, float, float, bool]]] = {}
    for i, e in enumerate(entries):
        if i not in claimed:
            lone.setdefault(e[1], []).append(e)
    works += [_work(("gemm", *s), es) for s, es in lone.items()]
    return sorted(works, key=lambda w: -w.time_us)[:TOP_SHAPES]


def _work(probe: Probe, members: list[tuple[str, Shape, float, float, bool]]) -> GemmWork:
    return GemmWork(probe, cb_us=sum(t for _o, _s, t, _b, mem in members if not mem),
                    mb_us=sum(t for _o, _s, t, _b, mem in members if mem),
                    mb_bytes=sum(b for _o, _s, _t, b, mem in members if mem))


def sizeable(works: list[GemmWork], costed_us: float) -> list[GemmWork]:
    """The works with at least ``MIN_SHARE`` of ``costed_us`` (the compute- and memory-bound
    time): the ones worth timing, and the only ones a ratio is taken over."""
    return [w for w in works if w.time_us >= MIN_SHARE * costed_us]


def summarise(works: list[GemmWork], ratios: dict[Probe, float], compute_bound_us: float,
              memory_bound_us: float = 0.0, memory_bytes: float = 0.0) -> AutocastGemms | None:
    """The time-weighted ratios over the works measured, apart for their compute-bound and
    memory-bound time (None: none was measured, or they took no time). ``memory_bytes``: all
    memory-bound fp32 bytes, as the works' are summed."""
    timed = [(w, ratios[w.probe]) for w in sizeable(works, compute_bound_us + memory_bound_us)
             if w.probe in ratios and ratios[w.probe] > 0]
    cb = sum(w.cb_us for w, _ in timed)
    mb = sum(w.mb_us for w, _ in timed)
    if cb <= 0 and mb <= 0:
        return None
    return AutocastGemms(
        ratio=sum(w.cb_us * r for w, r in timed) / cb if cb > 0 else 1.0,
        share=min(1.0, cb / compute_bound_us) if compute_bound_us > 0 else 0.0,
        shapes=len(timed),
        mem_ratio=sum(w.mb_us * r for w, r in timed) / mb if mb > 0 else 1.0,
        mem_share=min(1.0, mb / memory_bound_us) if memory_bound_us > 0 else 0.0,
        mem_bytes_share=(min(1.0, sum(w.mb_bytes for w, _ in timed) / memory_bytes)
                         if memory_bytes > 0 else 0.0),
        layers=sum(1 for w, _ in timed if w.probe[0] != "gemm"))


def _parse(shape: str, a: int, b: int) -> Shape | None:
    try:
        dims = json.loads(shape)
        (m, k), (k2, n) = dims[a], dims[b]
    except (ValueError, TypeError, IndexError):
        return None
    ok = all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (m, k, k2, n))
    return (m, k, n) if ok and k == k2 else None
