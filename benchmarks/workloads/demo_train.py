"""gpudiag's demo: a small image classifier held back by its DataLoader, on the CPU.

    make demo      # gpudiag profile -- python benchmarks/workloads/demo_train.py
    python benchmarks/workloads/demo_train.py --profile-out /tmp/demo && gpudiag analyze /tmp/demo

A two-layer CNN learns 10 classes of synthetic 32x32 images. Its Dataset reads the images in
the training process (``num_workers=0``) from slow storage, one shard of a batch per read
(READ_S, as tar shards on a network file system or an object store give), then decodes them. So
most of each step waits for the next batch, which is what gpudiag should find (input-bound,
with the DataLoader named) and what the usual fix (DataLoader workers) removes.

Why it is built this way: a step of ~100 ms, most of it one wait on storage, keeps the job's own
step-to-step spread at a few percent even on a busy 2-core machine (a busy CPU barely stretches a
wait on I/O), so the report's numbers are the job's and not noise; one intra-op thread, so the
model's small ops do not spin OpenMP threads against the machine's other work.
"""

from __future__ import annotations

import time

import torch
from _common import parse_args, train
from torch import nn
from torch.utils.data import DataLoader, Dataset

CLASSES, SIZE, BATCH = 10, 32, 16
READ_S = 0.100  # per shard of BATCH images: a read from slow shared storage
STEPS = 45  # enough untraced steps around gpudiag profile's trace window (skip 10, trace 5)


class SlowShards(Dataset):
    """Shards of BATCH synthetic images (noisy copies of their class's template), read slowly.

    The pixels are made once up front: what a step waits for is the read, not our generator.
    """

    def __init__(self, shards: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        templates = 0.3 * torch.randn(CLASSES, 3, SIZE, SIZE, generator=g)   # faint: learnt, not at once
        self.labels = torch.randint(0, CLASSES, (shards, BATCH), generator=g)
        self.images = templates[self.labels] + torch.randn(shards, BATCH, 3, SIZE, SIZE, generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(READ_S)  # the storage read
        return self.images[i], self.labels[i]


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], default_steps=STEPS)
    torch.set_num_threads(1)
    # batch_size=None: each shard is a batch already
    loader = DataLoader(SlowShards(args.steps, args.seed), batch_size=None, shuffle=True, num_workers=0)
    model = nn.Sequential(   # strided convolutions: 32x32 -> 16x16 -> 8x8
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(16 * (SIZE // 4) ** 2, CLASSES),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    loss = train(loader, model, opt, args.profile_out)
    print(f"demo_train: {args.steps} steps, final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
