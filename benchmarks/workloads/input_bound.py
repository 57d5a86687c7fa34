"""Input-bound: a slow Dataset feeding a small model through a single-process DataLoader.

Each sample is "decoded" in Python (a sleep standing in for file I/O plus a pure-Python
augmentation loop), with ``num_workers=0``, so the training process spends most of each step
inside ``DataLoader.__next__`` while the model's own step takes a millisecond or two.
Expected verdict: input-bound.
"""

from __future__ import annotations

import time

import torch
from _common import parse_args, train
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES, CLASSES, BATCH = 64, 10, 16
SAMPLE_IO_S = 0.004  # simulated read + decode latency per sample (a JPEG takes a few ms)


class SlowDataset(Dataset):
    """Synthetic samples that are slow to produce, like JPEGs decoded in Python."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(SAMPLE_IO_S)
        g = torch.Generator().manual_seed(i)
        raw = torch.rand(FEATURES, generator=g).tolist()
        # a per-element Python "augmentation": the kind of work that belongs in a worker
        feats = [min(1.0, max(0.0, v * 1.1 - 0.05)) for v in raw]
        return torch.tensor(feats), i % CLASSES


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    steps = args.steps
    loader = DataLoader(SlowDataset(steps * BATCH), batch_size=BATCH, shuffle=True, num_workers=0)
    model = nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss = train(loader, model, opt, args.profile_out)
    print(f"input_bound: final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
