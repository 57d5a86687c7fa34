"""Control for held_out_4 (nothing blocks): an fp32 MLP, 3 x Linear(1024, 1024) + a head, batch
128, SGD with momentum, its batch made once; the training thread computes the whole step (no
sleep, no I/O, no lock, no child process, no queue). Must not be read as blocked.

Truth: hand-counted FLOPs against the measured fp32 peak, the rest compute; the step's wall time
against the training thread's CPU time (``cpu_step_median_ms``: equal when nothing blocks).
Knobs for what gpudiag might advise on compute: ``--compile``, ``--bf16`` (autocast).
"""

from __future__ import annotations

import _blocked
import _zoo
import torch
import torch.nn as nn


def main() -> None:
    p = _zoo.parser(__doc__, steps=60, warmup=5)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--bf16", action="store_true", help="torch.autocast(cpu, bfloat16)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(threads=1)
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    model = _blocked.mlp(args.width, args.layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=args.foreach or None)
    x = torch.randn(args.batch, args.width)
    y = torch.randint(0, 10, (args.batch,))
    fwd = torch.compile(model) if args.compile else model
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                out = fwd(x)
            loss = nn.functional.cross_entropy(out.float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    truth = {"flops_per_step": _blocked.mlp_flops(args.batch, args.width, args.layers),
             "dtype": "bf16" if args.bf16 else "fp32",
             **_blocked.blocked_truth(args, timer, "nothing (control)")}
    _zoo.finish("pure_mlp", args, timer, truth,
                {"batch": args.batch, "bf16": args.bf16, "compile": args.compile,
                 "threads": threads})


if __name__ == "__main__":
    main()
