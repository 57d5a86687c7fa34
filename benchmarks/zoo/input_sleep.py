"""Input-bound, I/O-like: each sample's ``__getitem__`` sleeps (a read from slow storage).

With ``num_workers=0`` the training loop waits for every batch; sleeping workers need no core,
so more workers hide the wait. Truth: the time spent in ``next(loader)`` over the step.
"""

from __future__ import annotations

import time

import _zoo
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class SlowStorage(Dataset):
    def __init__(self, n: int, read_ms: float) -> None:
        self.n, self.read_s = n, read_ms / 1e3

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.read_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 32, 32, generator=g), i % 10


def main() -> None:
    p = _zoo.parser(__doc__, steps=150)
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--read-ms", type=float, default=3.0, help="sleep per sample")
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=args.foreach or None)
    loss_fn = nn.CrossEntropyLoss()
    data = SlowStorage(args.batch * (args.steps + 10), args.read_ms)
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
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    w = _zoo.median(timer.parts["input_wait"][args.warmup:])
    s = _zoo.median(timer.steps_ms[args.warmup:])
    truth = {"input_wait_ms": w, "input_wait_share": w / s,
             "read_ms_per_batch": args.read_ms * args.batch}
    _zoo.finish("input_sleep", args, timer, truth,
                {"workers": args.workers, "batch": args.batch, "foreach": args.foreach, "threads": threads})


if __name__ == "__main__":
    main()
