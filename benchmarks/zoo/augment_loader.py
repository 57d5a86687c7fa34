"""Input-bound by CPU augmentation in ``__getitem__`` with ``num_workers=0``: each 3x112x112
sample is randomly cropped to 80x80, flipped, colour-jittered and blurred (a 7x7 box filter,
in numpy) before a one-convolution model sees it, batch 32.

The augmentation is pure CPU work in the training process; workers move it to other
processes, which on this 2-core machine compete with the model's threads. Truth: the time in
``next(loader)`` over the step, in the same run.
"""

from __future__ import annotations

import _zoo
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Augmented(Dataset):
    def __init__(self, n: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.images = rng.random((16, 112, 112, 3), dtype=np.float32)
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        rng = np.random.default_rng(self.seed * 100003 + i)
        img = self.images[i % len(self.images)]
        y0, x0 = rng.integers(0, 32, 2)
        img = img[y0:y0 + 80, x0:x0 + 80]
        if rng.random() < 0.5:
            img = img[:, ::-1]
        img = img * rng.uniform(0.8, 1.2, 3).astype(np.float32) + rng.uniform(-0.1, 0.1)
        pad = np.pad(img, ((3, 3), (3, 3), (0, 0)), mode="reflect")
        out = np.zeros_like(img)
        for dy in range(7):
            for dx in range(7):
                out += pad[dy:dy + 80, dx:dx + 80]
        out = (out / 49.0 - 0.5) / 0.25
        return torch.from_numpy(np.ascontiguousarray(out.transpose(2, 0, 1))), i % 10


def main() -> None:
    p = _zoo.parser(__doc__, steps=40, warmup=4)
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    p.add_argument("--batch", type=int, default=32)
    p.set_defaults(threads=1)  # one intra-op thread: see the held-out-2 README section
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 4, stride=4), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=args.foreach or None)
    data = Augmented(args.batch * (args.steps + 20), args.seed)
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
    w = _zoo.median(timer.parts["input_wait"][args.warmup:])
    st = _zoo.median(timer.steps_ms[args.warmup:])
    truth = {"input_wait_ms": w, "input_wait_share": w / st}
    _zoo.finish("augment_loader", args, timer, truth,
                {"workers": args.workers, "batch": args.batch, "foreach": args.foreach,
                 "threads": threads})


if __name__ == "__main__":
    main()
