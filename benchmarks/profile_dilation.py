"""How much the torch profiler slows the steps it traces, per setting, and what gpudiag uses.

    python benchmarks/profile_dilation.py [--device cpu|cuda] [--steps 30] [--rounds 3]

A many-small-ops training job (a deep, narrow MLP: hundreds of tiny ops per step, where the
profiler's per-op cost matters most) runs untraced, then traced with each profiler setting
in turn, alternated over ``--rounds`` rounds so machine noise hits every setting alike. For
each setting it prints the median traced step over the median untraced step (the dilation)
and the profiler's cost per recorded op in microseconds. On a GPU (``--device cuda``) the
same job also runs a transformer block, whose kernels hide part of the host cost.

The last lines say what recording shapes costs over the plain profiler, per op: the number
behind the choice in collectors/torch_bootstrap.py (shapes on, stack/memory/FLOPs off).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

SETTINGS: dict[str, dict] = {
    "plain (no shapes)": {},
    "record_shapes": {"record_shapes": True},
    "record_shapes + with_flops": {"record_shapes": True, "with_flops": True},
    "record_shapes + with_stack": {"record_shapes": True, "with_stack": True},
    "record_shapes + profile_memory": {"record_shapes": True, "profile_memory": True},
}


def make_job(device: str, layers: int = 16, width: int = 64, batch: int = 32):
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.GELU()]
    model = torch.nn.Sequential(*mods).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)  # per-param: many ops
    x = torch.randn(batch, width, device=device)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    return step


def timed_steps(step, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        out.append(time.perf_counter() - t)
    return out


def traced_steps(step, n: int, kwargs: dict, device: str) -> tuple[list[float], int]:
    """Step times inside an active profiler window, and the ops recorded per step."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts, **kwargs) as prof:
        times = timed_steps(step, n)
    ops = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU)
    return times, ops // n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=3, help="steps per block")
    ap.add_argument("--rounds", type=int, default=12, help="interleaved rounds of blocks")
    args = ap.parse_args()
    step = make_job(args.device)
    timed_steps(step, 10)  # warm up: allocator, lazy init
    base: list[float] = []
    traced: dict[str, list[float]] = {k: [] for k in SETTINGS}
    ops: dict[str, int] = {}
    # Short blocks, interleaved for many rounds: a busy moment on a shared machine lands on
    # every setting alike instead of on one block of them.
    for _ in range(args.rounds):
        base += timed_steps(step, args.steps)
        for name, kw in SETTINGS.items():
            times, n_ops = traced_steps(step, args.steps, kw, args.device)
            traced[name] += times
            ops[name] = n_ops
    u = statistics.median(base)
    print(f"device {args.device}; untraced step {u * 1e3:.3f} ms (median of {len(base)})")
    print(f"{'setting':34s} {'traced ms':>10s} {'dilation':>9s} {'us/op':>7s} {'ops/step':>9s}")
    for name in SETTINGS:
        t = statistics.median(traced[name])
        print(f"{name:34s} {t * 1e3:10.3f} {t / u:9.2f}x {(t - u) / ops[name] * 1e6:7.2f} {ops[name]:9d}")
    plain = statistics.median(traced["plain (no shapes)"])
    shapes = statistics.median(traced["record_shapes"])
    extra = (shapes - plain) / ops["record_shapes"] * 1e6
    print(f"shapes cost {extra:+.2f} us/op over the plain profiler ({100 * (shapes / plain - 1):+.0f}% of a "
          "traced step): recording shapes on one traced step only would save about that much;")
    print("stack, memory and FLOP recording are what gpudiag leaves off. The verdict and MFU no longer "
          "depend on the dilation left: they come from the untraced steps.")

if __name__ == "__main__":
    main()
