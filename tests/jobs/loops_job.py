"""A small CPU training job whose host work is a Python loop: over samples in its loss, or over
micro-batches of gradient accumulation (the held-out zoo's py_loss and grad_accum, written
again for the tests: a per-sample hinge loss, and many tiny micro-batches per optimizer step).

    python loops_job.py --loss loop --batch 64 --report own.json          # loop over samples
    python loops_job.py --loss batch --micro 4 --batch 64 --report own.json  # 16 micro-batches
    python loops_job.py --norm --micro 4 --batch 128 --report own.json  # LayerNorm/GELU on 4 rows
    python loops_job.py --per-sample --report own.json   # the model called on one row at a time

``--report`` writes its own step times and what it did (loss iterations and micro-batches per
optimizer step).
"""

import argparse

import torch
from _timer import OwnTimer

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--batch", type=int, default=64, help="samples per optimizer step")
ap.add_argument("--micro", type=int, default=0, help="samples per micro-batch (0: the batch)")
ap.add_argument("--loss", choices=("loop", "batch"), default="batch")
ap.add_argument("--width", type=int, default=128)
ap.add_argument("--classes", type=int, default=20)
ap.add_argument("--norm", action="store_true",
                help="Linear, LayerNorm, GELU blocks (the zoo's grad_accum) instead of Linear, ReLU")
ap.add_argument("--per-sample", action="store_true",
                help="call the model once per sample (a row at a time) and stack the scores")
ap.add_argument("--report", required=True)
args = ap.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
if args.norm:
    model = torch.nn.Sequential(torch.nn.Linear(32, args.width), torch.nn.LayerNorm(args.width),
                                torch.nn.GELU(), torch.nn.Linear(args.width, args.width),
                                torch.nn.LayerNorm(args.width), torch.nn.GELU(),
                                torch.nn.Linear(args.width, args.classes))
else:
    model = torch.nn.Sequential(torch.nn.Linear(32, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, args.classes))
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
x = torch.randn(args.batch, 32)
y = torch.randint(0, args.classes, (args.batch,))


def loop_loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    total = scores.new_zeros(())
    rows = labels.tolist()
    for i in range(scores.shape[0]):
        s = scores[i]
        total = total + torch.clamp(1.0 - s[rows[i]] + s, min=0.0).sum()
    return total / scores.shape[0]


def batch_loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    pos = scores.gather(1, labels[:, None])
    return torch.clamp(1.0 - pos + scores, min=0.0).sum(1).mean()


loss_fn = loop_loss if args.loss == "loop" else batch_loss
micro = args.micro or args.batch
n_micro = max(1, args.batch // micro)
own = OwnTimer()
for _ in range(args.steps):
    opt.zero_grad(set_to_none=True)
    for m in range(n_micro):
        sl = slice(m * micro, (m + 1) * micro)
        xs = x[sl]
        scores = (torch.stack([model(xs[i]) for i in range(xs.shape[0])]) if args.per_sample
                  else model(xs))
        (loss_fn(scores, y[sl]) / n_micro).backward()
    opt.step()
    own.lap()
own.write(args.report, loss_iterations=args.batch if args.loss == "loop" else 0, micro_batches=n_micro,
          model_calls=args.batch if args.per_sample else n_micro)
