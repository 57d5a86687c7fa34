"""Is compute right after an idle wait slower than back to back? The DataLoader case of
"predicted vs applied" timed in parts, unobserved.

    python benchmarks/post_wait_compute.py [--rounds 3] [--steps 30]

The model and reader of tests/jobs/feed_job.py (a 120 ms read per batch, 4 forward/backward
passes of a 512 -> 2048 -> 2048 -> 1 MLP and an SGD step), with 0 DataLoader workers (the main
process sleeps through each read) and with 4 (the batches are ready: compute runs back to back).
Per setting, medians over the steps after the first 5: the step, the compute (4 passes and the
optimizer), the first pass alone. gpudiag's prediction for ``num_workers 0 -> 4`` keeps the
compute as traced after the wait; where it runs faster back to back, the prediction
under-promises by the difference (docs/diagnosis.md).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset

READ_S, BATCH, WIDTH, PASSES = 0.12, 16, 512, 4


class Slow(Dataset):
    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(READ_S)
        g = torch.Generator().manual_seed(i)
        return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, 1, generator=g)


def run(model: torch.nn.Module, opt: torch.optim.Optimizer, workers: int, steps: int
        ) -> tuple[float, float, float]:
    batches = iter(DataLoader(Slow(), batch_size=None, num_workers=workers,
                              persistent_workers=workers > 0))
    step, comp, first = [], [], []
    prev = time.perf_counter()
    for k in range(steps):
        x, y = next(batches)
        t0 = time.perf_counter()
        for p in range(PASSES):
            torch.nn.functional.mse_loss(model(x), y).backward()
            if p == 0:
                t1 = time.perf_counter()
        opt.step()
        opt.zero_grad()
        t2 = time.perf_counter()
        if k >= 5:
            step.append(t2 - prev)
            comp.append(t2 - t0)
            first.append(t1 - t0)
        prev = t2
    return tuple(1e3 * statistics.median(v) for v in (step, comp, first))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 2048),
                                torch.nn.GELU(), torch.nn.Linear(2048, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    for rnd in range(args.rounds):
        for workers in (0, 4):
            s, c, f = run(model, opt, workers, args.steps)
            print(f"round {rnd}, {workers} workers: step {s:.1f} ms, compute (passes + optimizer) "
                  f"{c:.1f} ms, first pass {f:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
