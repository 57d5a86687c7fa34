"""Memory-bound, norm-heavy: LayerNorm, softmax, GELU, dropout and residual adds on
(16, 256, 512) activations (8 MB each), six blocks, with one small projection at the end.

Reductions and elementwise operators that each stream the activation, with few FLOPs per byte.
Truth: step time against work: the same job at 4x the tokens (``--seq 1024``) takes ~4x as long
when it is data-bound, not per-operator cost; and the bytes of the forward's operators over the
step, against the runner's measured copy bandwidth (a floor: backward moves more).
"""

from __future__ import annotations

import _zoo
import torch
import torch.nn as nn


class NormBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.ln2 = nn.LayerNorm(d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.softmax(self.ln1(x), dim=-1) * x.shape[-1]
        h = self.drop(nn.functional.gelu(self.ln2(h)))
        return x + h


def main() -> None:
    p = _zoo.parser(__doc__, steps=80, warmup=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--bf16", action="store_true", help="activations in bfloat16 (autocast does "
                   "not cover these operators on the CPU, so the input itself is cast)")
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    body = nn.Sequential(*[NormBlock(args.dim) for _ in range(args.blocks)])
    head = nn.Linear(args.dim, 10)
    if args.bf16:
        body = body.bfloat16()
    fwd = torch.compile(body) if args.compile else body
    params = list(body.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=args.foreach or None)
    x = torch.randn(args.batch, args.seq, args.dim, requires_grad=False)
    if args.bf16:
        x = x.bfloat16()
    y = torch.randint(0, 10, (args.batch,))
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            h = fwd(x)
            loss = nn.functional.cross_entropy(head(h.float().mean(dim=1)), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    n = args.batch * args.seq * args.dim
    # Forward per block, eager: ln1 (read, write), softmax (r, w), mul (r, w), ln2 (r, w),
    # gelu (r, w), dropout (r, w, and its mask), add (2r, w) = 15 activation-sized passes.
    fwd_passes = 15 * args.blocks
    elt = 2 if args.bf16 else 4
    s = _zoo.median(timer.steps_ms[args.warmup:])
    truth = {"fwd_bytes_per_step": fwd_passes * n * elt,
             "fwd_gbps": fwd_passes * n * elt / s / 1e6, "elements": n}
    _zoo.finish("norm_heavy", args, timer, truth,
                {"batch": args.batch, "seq": args.seq, "compile": args.compile,
                 "bf16": args.bf16, "foreach": args.foreach, "threads": threads})


if __name__ == "__main__":
    main()
