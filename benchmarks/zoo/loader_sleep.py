"""Control for held_out_4 (input-bound through the DataLoader, not "blocked"): a ``DataLoader``
with ``num_workers=0`` whose ``__getitem__`` sleeps ``--read-ms`` (0.4 ms) a sample (a read from
slow storage), batch 32, on an MLP, 3 x Linear(512, 512) + a head, SGD.

The training thread sleeps too, but inside ``next(loader)``: that is an input wait, and the fix
is DataLoader workers, so it must stay input-bound and not be read as a thread blocked outside
the DataLoader. Truth: the time in ``next(loader)`` over the step (the zoo's input-wait share),
the rest compute. Knob: ``--workers N``.
"""

from __future__ import annotations

import time

import _blocked
import _zoo
import torch
from torch.utils.data import DataLoader, Dataset


class SlowRows(Dataset):
    def __init__(self, n: int, width: int, read_ms: float) -> None:
        self.n, self.width, self.read_s = n, width, read_ms / 1e3

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.read_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.width, generator=g), i % 10


def main() -> None:
    p = _zoo.parser(__doc__, steps=60, warmup=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--read-ms", type=float, default=0.4, help="sleep a sample")
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(threads=1)
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    model = _blocked.mlp(args.width, args.layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=args.foreach or None)
    fwd = torch.compile(model) if args.compile else model
    data = SlowRows(args.batch * (args.steps + 10), args.width, args.read_ms)
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
            _blocked.train_step(model, fwd, opt, x, y)
    w = sum(timer.parts["input_wait"][args.warmup:]) / max(len(timer.steps_ms) - args.warmup, 1)
    s = sum(timer.steps_ms[args.warmup:]) / max(len(timer.steps_ms) - args.warmup, 1)
    truth = {"flops_per_step": _blocked.mlp_flops(args.batch, args.width, args.layers),
             "input_wait_ms": w, "input_wait_share": w / s,
             "read_ms_per_batch": args.read_ms * args.batch}
    _zoo.finish("loader_sleep", args, timer, truth,
                {"workers": args.workers, "batch": args.batch, "compile": args.compile,
                 "threads": threads})


if __name__ == "__main__":
    main()
