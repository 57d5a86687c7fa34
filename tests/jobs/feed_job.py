"""A training job fed by a DataLoader whose samples are slow to read (a sleep per sample, as
file or network I/O is), with its own step timer: the input-bound job of "predicted vs applied".

    python feed_job.py --workers 0 --steps 80 --report own.json
    python feed_job.py --workers 0 --fixed-workers 4 --phases b40,a20 --steps 160 --report own.json

Each batch takes ``--read-ms`` to read (one record of ``--batch`` samples, as from a shard:
one wait per step, not one per sample, whose wake-ups on a loaded VM cost the compute after
them more than the wait itself); the model's step takes longer than the reading divided by 4,
so 4 workers hide the reading entirely. ``--decode-mb`` adds CPU work to each batch (a zlib
shard decompressed), so the loading needs cores, not only time; ``--augment-px`` augments each
sample on the CPU as torchvision's transforms do (crop, antialiased resize, flip, colour jitter of
a uint8 image, one sample at a time), in a process of ``--threads`` intra-op threads that spin
while the loading runs on the main thread. With ``--phases`` (``_phases``)
the "a" steps read from a second DataLoader with ``--fixed-workers``. ``--report`` gets the
job's own step times (from the end of one optimizer step to the end of the next, as gpudiag's
timer) and each step's phase.
"""

import argparse
import os
import time
import zlib

import torch
from _phases import schedule
from _timer import OwnTimer
from torch.utils.data import DataLoader, Dataset

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=80)
ap.add_argument("--workers", type=int, default=0)
ap.add_argument("--fixed-workers", type=int, default=4)
ap.add_argument("--phases", default="b1")
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--read-ms", type=float, default=30.0)
ap.add_argument("--decode-mb", type=float, default=0.0,
                help="MB each batch decompresses (zlib, as compressed shards are): CPU work")
ap.add_argument("--augment-px", type=int, default=0,
                help="augment each sample from a uint8 image this many pixels square (CPU work)")
ap.add_argument("--threads", type=int, default=1, help="the training process's intra-op threads")
ap.add_argument("--width", type=int, default=512)
ap.add_argument("--passes", type=int, default=1, help="forward/backward passes per batch")
ap.add_argument("--report", required=True)
args = ap.parse_args()


class Slow(Dataset):
    """Batches of samples, each batch slow to read."""

    def __len__(self) -> int:
        return args.steps

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(args.read_ms / 1e3)
        if SHARD:
            zlib.decompress(SHARD)
        g = torch.Generator().manual_seed(i)
        if args.augment_px:
            return augment(g), torch.randn(args.batch, 1, generator=g)
        return torch.randn(args.batch, args.width, generator=g), torch.randn(args.batch, 1, generator=g)


def augment(g: torch.Generator) -> torch.Tensor:
    """A batch of samples augmented one at a time, as a torchvision v2 pipeline does: a random
    crop, an antialiased resize, a flip and a colour jitter of a uint8 image."""
    px, side = args.augment_px, 32
    out = []
    for _ in range(args.batch):
        img = torch.randint(0, 256, (3, px, px), dtype=torch.uint8, generator=g)
        c = int(torch.randint(px // 2, px + 1, (1,), generator=g))
        y, x = (int(v) for v in torch.randint(0, px - c + 1, (2,), generator=g))
        crop = img[:, y:y + c, x:x + c].float().unsqueeze(0)
        small = torch.nn.functional.interpolate(crop, size=(side, side), mode="bilinear",
                                                antialias=True)[0]
        if bool(torch.rand(1, generator=g) < 0.5):
            small = small.flip(-1)
        small = (small * (0.8 + 0.4 * torch.rand(1, generator=g)) + 0.1).clamp_(0, 255) / 255
        out.append(small - small.mean())
    return torch.stack(out).flatten(1)[:, :args.width]


# a compressed shard (1 MiB of random bytes, repeated: zlib's matches, not the bytes, cost)
SHARD = zlib.compress(os.urandom(1 << 20) * max(1, round(args.decode_mb)), 1) if args.decode_mb else b""
torch.manual_seed(0)
torch.set_num_threads(args.threads)
model = torch.nn.Sequential(torch.nn.Linear(args.width, 2048), torch.nn.GELU(),
                            torch.nn.Linear(2048, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
plan = schedule(args.phases, args.steps)


def loader(workers: int):  # an endless iterator of batches
    while True:
        yield from DataLoader(Slow(), batch_size=None, num_workers=workers,
                              persistent_workers=workers > 0)


feeds = {"b": loader(args.workers)}
if "a" in plan:
    feeds["a"] = loader(args.fixed_workers)
own = OwnTimer()
for phase in plan:
    x, y = next(feeds[phase])
    # the model's step: the work the reading should hide behind
    for _ in range(args.passes):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
    opt.step()
    opt.zero_grad()
    own.lap()
own.write(args.report, phases=plan)
