"""Synthetic GPU training-like loops with known answers, for benchmarks/gpu_validation.py.

    python gpu_synthetic.py --kind gemm|elementwise|input|host|nccl [--steps N]

Each step ends with a (tiny) optimizer step so ``gpudiag profile`` counts steps exactly as
it does in real jobs. The GEMM kind prints its analytic FLOPs per step.
"""

import argparse
import os
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--kind", required=True, choices=["gemm", "elementwise", "input", "host", "nccl"])
ap.add_argument("--steps", type=int, default=30)
args = ap.parse_args()
dev = "cuda"
param = torch.nn.Parameter(torch.zeros(1, device=dev))
opt = torch.optim.SGD([param], lr=0.0)


def finish_step() -> None:
    param.grad = torch.zeros_like(param)
    opt.step()
    torch.cuda.synchronize()


if args.kind == "gemm":
    n, reps = 8192, 8
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    print(f"analytic_flops_per_step {reps * 2 * n**3}", flush=True)

    def work() -> None:
        for _ in range(reps):
            torch.mm(a, b)
elif args.kind == "elementwise":
    x = torch.randn(1 << 28, device=dev)

    def work() -> None:
        y = torch.relu(x * 2.0) + x
        y.mul_(0.5)
elif args.kind == "input":
    class Slow(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 10**6

        def __getitem__(self, i: int) -> torch.Tensor:
            time.sleep(0.001)
            return torch.randn(256)

    it = iter(torch.utils.data.DataLoader(Slow(), batch_size=32, num_workers=0))
    w = torch.randn(256, 256, device=dev)

    def work() -> None:
        (next(it).to(dev) @ w).sum()
elif args.kind == "host":
    t = torch.zeros(1, device=dev)

    def work() -> None:
        global t
        for _ in range(1500):
            t = t + 1
else:  # nccl: one-rank NCCL group, exercising the flight-recorder timing path
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    buf = torch.randn(1 << 26, device=dev)
    w = torch.randn(4096, 4096, device=dev)

    def work() -> None:
        (w @ w).sum()
        dist.all_reduce(buf)

for _ in range(args.steps):
    work()
    finish_step()
if args.kind == "nccl":
    torch.distributed.destroy_process_group()
print(f"{args.kind}: done", flush=True)
