"""What a call of torch.compile'd code costs on this CPU, against an eager operator call of the
same model: the ratios ``whatif.compiled_cpu`` assumes (RHO, GRAPH_CALLS).

    python benchmarks/compile_calls.py

For four small models (tiny tensors, so every call is dispatch, not work: Linear-LayerNorm-GELU
blocks trained and run, chains of 8 and 32 elementwise operators between GEMMs run), each at 2
and 10 blocks, eager and compiled: the time per block (the slope between the two sizes), the
eager top-level operator calls per block and the calls compiled code makes instead (GEMMs, and
one per run of other calls between them, counted from a profile of the eager model as
``analyzers.compile_facts`` counts a job's trace), and the graph's own cost (the intercept).
Prints per model: eager us per call, compiled us per kernel call, their ratio (rho), and the
graph's cost in eager calls. Times are the lower quartile of 80 runs after a warm-up. Last, 16
trained blocks in one forward with 0, 1, 3 and 7 values read back into Python and branched on
(graph breaks): what a break costs compiled (``advice._forward_breaks``: compile is not advised on
a CPU where the forward reads values back into Python).
"""

from __future__ import annotations

import os
import platform
import time

import torch

GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
W = 32


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(W, W)
        self.norm = torch.nn.LayerNorm(W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.norm(self.lin(x)))


class Chain(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(W, W) / 6)
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x @ self.w
        for i in range(self.n):
            x = torch.relu(x * 0.9 + 0.01 * i) if i % 3 == 0 else x * 1.01 - 0.001 * i
        return x


class Checked(torch.nn.Module):
    """16 blocks in one forward, a value read back into Python and branched on (``.item()``) after
    every ``every``-th block but the last: 16 / every - 1 graph breaks in one frame, as a job
    that checks a value every few blocks has."""

    def __init__(self, every: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(16))
        self.every = every

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, b in enumerate(self.blocks):
            x = b(x)
            if (i + 1) % self.every == 0 and i < 15 and x.abs().mean().item() > 1e6:
                x = x * 0.5
        return x


def break_cost() -> None:
    """What a graph break costs compiled, trained: the compiled step of ``Checked`` at 0, 1, 3
    and 7 breaks, its slope per break over the eager step's cost per top-level call. A break
    splits the forward and the backward (two graphs, as ``compile_facts`` counts them)."""
    x = torch.randn(4, W)
    eager, comp = {}, {}
    for every in (16, 8, 4, 2):
        m = Checked(every)
        cm = torch.compile(m)
        cm(x).sum().backward()
        comp[16 // every - 1] = quartile_us(lambda cm=cm: cm(x).sum().backward())
        eager[16 // every - 1] = quartile_us(lambda m=m: m(x).sum().backward())
    plain = Checked(16)
    calls = counts(lambda: plain(x).sum().backward())[0]
    call_us = eager[0] / calls
    slope = (comp[7] - comp[0]) / 7
    print(f"16 blocks trained, eager {eager[0]:.0f} us ({calls} calls, {call_us:.2f} us each); compiled at "
          f"0/1/3/7 breaks {comp[0]:.0f}/{comp[1]:.0f}/{comp[3]:.0f}/{comp[7]:.0f} us (eager "
          f"{eager[1]:.0f}/{eager[3]:.0f}/{eager[7]:.0f}); a break {slope:.0f} us, a graph split off by "
          f"one {slope / 2:.0f} us = {slope / 2 / call_us:.1f} eager calls", flush=True)


def quartile_us(f, n: int = 80) -> float:
    for _ in range(5):
        f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 4] * 1e6


def counts(f) -> tuple[int, int]:
    """(top-level eager calls, calls compiled code makes) of one run of ``f``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as p:
        f()
    ev = sorted(p.events(), key=lambda e: (e.time_range.start, -e.time_range.end))
    stack, top = [], []
    for e in ev:
        while stack and stack[-1].time_range.end <= e.time_range.start:
            stack.pop()
        if not stack:
            top.append(e)
        stack.append(e)
    gemms = [e for e in ev if e.name in GEMM]
    top = [t for t in top if "AccumulateGrad" not in t.name]
    runs, in_run = 0, False
    for t in top:
        if any(t.time_range.start <= g.time_range.start < t.time_range.end for g in gemms):
            in_run = False
        elif not in_run:
            runs, in_run = runs + 1, True
    return len(top), len(gemms) + runs


def main() -> None:
    torch.set_num_threads(1)
    load = os.getloadavg()
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"load average {load[0]:.1f}")
    x = torch.randn(4, W)
    models = (("blocks, trained", Block, True), ("blocks, run", Block, False),
              ("chain of 8, run", lambda: Chain(8), False), ("chain of 32, run", lambda: Chain(32), False))
    for name, make, train in models:
        res = {}
        for k in (2, 10):
            m = torch.nn.Sequential(*[make() for _ in range(k)])
            cm = torch.compile(m)
            eager = (lambda m=m: m(x).sum().backward()) if train else (lambda m=m: m(x))
            compiled = (lambda cm=cm: cm(x).sum().backward()) if train else (lambda cm=cm: cm(x))
            with torch.enable_grad() if train else torch.no_grad():
                compiled()
                res[k] = (quartile_us(eager), quartile_us(compiled), *counts(eager))
        (e2, c2, n2, k2), (e10, c10, n10, k10) = res[2], res[10]
        per_e, per_c = (e10 - e2) / 8, (c10 - c2) / 8
        calls, kernels = (n10 - n2) / 8, (k10 - k2) / 8
        graph = c2 - 2 * per_c
        call_us = per_e / calls
        print(f"{name:<18} eager {call_us:6.2f} us/call ({calls:.0f} calls/block), compiled "
              f"{per_c / kernels:6.2f} us/kernel ({kernels:.0f} kernels/block): rho "
              f"{per_c / kernels / call_us:.2f}; graph {graph:.0f} us = {graph / call_us:.1f} eager calls",
              flush=True)
    break_cost()
    load = os.getloadavg()
    print(f"load average after: {load[0]:.1f}")


if __name__ == "__main__":
    main()
