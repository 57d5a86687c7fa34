"""Compute-bound transformer: 2 pre-norm blocks (multi-head self-attention written as
matmul + softmax + matmul, and a 4x MLP), d_model 384, 6 heads, sequence 128, batch 4, AdamW.

The attention is written by hand (no ``scaled_dot_product_attention``), as many research
codebases still do. Truth: FLOPs counted by hand (every GEMM and the two attention batched
matmuls, forward and backward) against the measured fp32 peak, and the fixed per-step cost from
the step at 2x the batch. Knobs: ``--sdpa`` (fused attention), ``--bf16`` (autocast),
``--compile``.
"""

from __future__ import annotations

import math

import _zoo
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812


class Block(nn.Module):
    def __init__(self, d: int, heads: int, sdpa: bool) -> None:
        super().__init__()
        self.h, self.sdpa = heads, sdpa
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, s, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        if self.sdpa:
            a = F.scaled_dot_product_attention(q, k, v)
        else:
            w = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.h)
            a = w.softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.n2(x))))


def main() -> None:
    p = _zoo.parser(__doc__, steps=30, warmup=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--d", type=int, default=384)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--sdpa", action="store_true", help="F.scaled_dot_product_attention")
    p.add_argument("--bf16", action="store_true", help="torch.autocast(cpu, bfloat16)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(threads=1)  # one intra-op thread: see the held-out-2 README section
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    d, s, b = args.d, args.seq, args.batch
    model = nn.Sequential(*[Block(d, 6, args.sdpa) for _ in range(args.layers)],
                          nn.LayerNorm(d), nn.Linear(d, 1000))
    fwd = torch.compile(model) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=args.foreach or None)
    x = torch.randn(b, s, d)
    y = torch.randint(0, 1000, (b * s,))
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                out = fwd(x)
            loss = F.cross_entropy(out.float().view(b * s, -1), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    t = b * s
    per_layer = 2 * t * (3 * d * d + d * d + 8 * d * d) + 2 * 2 * b * s * s * d
    flops = 3 * (args.layers * per_layer + 2 * t * d * 1000)
    st = _zoo.median(timer.steps_ms[args.warmup:])
    truth = {"flops_per_step": flops, "achieved_gflops": flops / st / 1e6,
             "dtype": "bf16" if args.bf16 else "fp32"}
    _zoo.finish("attn_block", args, timer, truth,
                {"batch": b, "sdpa": args.sdpa, "bf16": args.bf16, "compile": args.compile,
                 "foreach": args.foreach, "threads": threads})


if __name__ == "__main__":
    main()
