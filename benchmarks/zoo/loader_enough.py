"""Compute-bound with a DataLoader that already keeps up: 2 workers, each sample a 1.5 ms read
(a sleep: storage, no CPU), batches of 16, a 5-layer CNN (32 channels) on 32x32 images.

Two workers deliver a batch every ~12 ms while the model's step takes several times that, so
the batch is ready when asked for: adding workers cannot help. Truth: the time in
``next(loader)`` over the step (in the same run); the rest is the model's convolutions.
"""

from __future__ import annotations

import time

import _zoo
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Storage(Dataset):
    def __init__(self, n: int, read_ms: float, size: int) -> None:
        self.n, self.read_s, self.size = n, read_ms / 1e3, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.read_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, self.size, self.size, generator=g), i % 10


def main() -> None:
    p = _zoo.parser(__doc__, steps=60, warmup=5)
    p.add_argument("--workers", type=int, default=2, help="DataLoader num_workers")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--read-ms", type=float, default=1.5, help="sleep per sample")
    p.add_argument("--size", type=int, default=32)
    p.set_defaults(threads=1)  # one intra-op thread: see the held-out-2 README section
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    c = 32
    model = nn.Sequential(
        nn.Conv2d(3, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1), nn.ReLU(),
        nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=args.foreach or None)
    data = Storage(args.batch * (args.steps + 20), args.read_ms, args.size)
    loader = DataLoader(data, batch_size=args.batch, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    it = iter(loader)
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            with timer.part("input_wait"):
                x, y = next(it)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    s, hw = args.size, args.size // 2
    conv = lambda cin, n: 2 * 9 * cin * c * n * n  # noqa: E731
    flops = 3 * args.batch * (conv(3, s) + 2 * conv(c, s) + 2 * conv(c, hw))
    w = _zoo.median(timer.parts["input_wait"][args.warmup:])
    st = _zoo.median(timer.steps_ms[args.warmup:])
    truth = {"input_wait_ms": w, "input_wait_share": w / st, "flops_per_step": flops,
             "loader_ms_per_batch_per_worker": args.batch * args.read_ms}
    _zoo.finish("loader_enough", args, timer, truth,
                {"workers": args.workers, "batch": args.batch, "foreach": args.foreach,
                 "threads": threads})


if __name__ == "__main__":
    main()
