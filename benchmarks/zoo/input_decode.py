"""Input-bound, CPU decoding: each sample is a zlib-compressed blob decoded in ``__getitem__``.

With ``num_workers=0`` the training loop decodes every batch itself. Unlike a storage wait, the
decoding needs a core: on 2 cores, workers compete with the model's threads. Truth: the time
spent in ``next(loader)`` over the step.
"""

from __future__ import annotations

import zlib

import _zoo
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Compressed(Dataset):
    def __init__(self, n: int, blob_kb: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        # Compressible bytes (small alphabet, runs), like an encoded image.
        self.blobs = []
        for _ in range(32):
            raw = np.repeat(rng.integers(0, 16, blob_kb * 1024 // 4, dtype=np.uint8), 4)
            self.blobs.append(zlib.compress(raw.tobytes(), 6))
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        raw = np.frombuffer(zlib.decompress(self.blobs[i % len(self.blobs)]), dtype=np.uint8)
        img = raw[: 3 * 32 * 32].astype(np.float32).reshape(3, 32, 32)
        img = (img - img.mean()) / (img.std() + 1e-5)
        return torch.from_numpy(img), i % 10


def main() -> None:
    p = _zoo.parser(__doc__, steps=150)
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--blob-kb", type=int, default=1024, help="decoded size of a sample")
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=args.foreach or None)
    loss_fn = nn.CrossEntropyLoss()
    data = Compressed(args.batch * (args.steps + 10), args.blob_kb, args.seed)
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
    truth = {"input_wait_ms": w, "input_wait_share": w / s}
    _zoo.finish("input_decode", args, timer, truth,
                {"workers": args.workers, "batch": args.batch, "foreach": args.foreach, "threads": threads})


if __name__ == "__main__":
    main()
