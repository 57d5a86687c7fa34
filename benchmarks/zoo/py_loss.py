"""Host-bound by the loss: a per-sample Python loop (a margin ranking loss over each sample's
classes, one small tensor expression per sample) on top of a small MLP, batch 128.

Every sample costs a handful of tiny operators and the interpreter's time between them; the
model itself is ~1 MFLOP a sample. Truth: the step with the same loss vectorised
(``--vectorised``: identical value, one expression for the batch), alternated; the share the
loop costs is 1 - vectorised / loop.
"""

from __future__ import annotations

import _zoo
import torch
import torch.nn as nn


def loop_loss(scores: torch.Tensor, y: torch.Tensor, margin: float) -> torch.Tensor:
    total = scores.new_zeros(())
    labels = y.tolist()
    for i in range(scores.shape[0]):
        s = scores[i]
        pos = s[labels[i]]
        viol = torch.clamp(margin - pos + s, min=0.0)
        total = total + (viol.sum() - margin) / (s.shape[0] - 1)
    return total / scores.shape[0]


def vec_loss(scores: torch.Tensor, y: torch.Tensor, margin: float) -> torch.Tensor:
    pos = scores.gather(1, y[:, None])
    viol = torch.clamp(margin - pos + scores, min=0.0)
    return ((viol.sum(1) - margin) / (scores.shape[1] - 1)).mean()


def main() -> None:
    p = _zoo.parser(__doc__, steps=40, warmup=5)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--classes", type=int, default=50)
    p.add_argument("--vectorised", action="store_true", help="the loss as one batch expression")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(threads=1)  # one intra-op thread: see the held-out-2 README section
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    w = args.width
    model = nn.Sequential(nn.Linear(64, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                          nn.Linear(w, args.classes))
    fwd = torch.compile(model) if args.compile else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=args.foreach or None)
    x = torch.randn(args.batch, 64)
    y = torch.randint(0, args.classes, (args.batch,))
    loss_fn = vec_loss if args.vectorised else loop_loss
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            out = fwd(x)
            with timer.part("loss"):
                loss = loss_fn(out, y, 1.0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    flops = 6 * args.batch * (64 * w + w * w + w * args.classes)
    truth = {"flops_per_step": flops, "loss_fwd_ms": _zoo.median(timer.parts["loss"][args.warmup:]),
             "ops_in_loss_per_step": 0 if args.vectorised else 5 * args.batch}
    _zoo.finish("py_loss", args, timer, truth,
                {"batch": args.batch, "vectorised": args.vectorised, "compile": args.compile,
                 "foreach": args.foreach, "threads": threads})


if __name__ == "__main__":
    main()
