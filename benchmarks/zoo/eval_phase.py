"""A job with an eval phase every 25 steps: 40 forward batches under ``torch.no_grad()``.

The training steps are an fp32 MLP (1024 wide, batch 128); the eval runs between two optimizer
steps, so a step timer that counts optimizer steps sees one long step every 25. Truth: the
training steps' achieved FLOP/s (hand-counted FLOPs) against the runner's measured peak, and
the eval's share of the run's wall time (``--eval-every 0`` removes it).
"""

from __future__ import annotations

import _zoo
import torch
import torch.nn as nn


def main() -> None:
    p = _zoo.parser(__doc__, steps=160, warmup=5)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--eval-every", type=int, default=25, help="0: no eval")
    p.add_argument("--eval-batches", type=int, default=40)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--bf16", action="store_true", help="torch.autocast(cpu, bfloat16)")
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 10))
    fwd = torch.compile(model) if args.compile else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=args.foreach or None)
    x = torch.randn(args.batch, args.width)
    y = torch.randint(0, 10, (args.batch,))
    xe = torch.randn(args.batch, args.width)
    timer = _zoo.Timer()
    correct = 0
    for i in range(args.steps):
        if timer.over(args):
            break
        evals = args.eval_every and (i + 1) % args.eval_every == 0
        with timer.step("eval" if evals else "train"):
            model.train()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                out = fwd(x)
            loss = nn.functional.cross_entropy(out.float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if evals:
                with timer.part("eval"):
                    model.eval()
                    with torch.no_grad():
                        for _ in range(args.eval_batches):
                            correct += int((fwd(xe).argmax(1) == 0).sum())
    keep = range(args.warmup, len(timer.steps_ms))
    train = [timer.steps_ms[j] for j in keep if timer.kinds[j] == "train"]
    total = sum(timer.steps_ms[j] for j in keep)
    ev = sum(timer.parts["eval"][j] for j in keep) if "eval" in timer.parts else 0.0
    flops = 3 * 2 * args.batch * (args.width * args.width * args.layers + args.width * 10)
    s = _zoo.median(train)
    truth = {"flops_per_step": flops, "achieved_gflops": flops / s / 1e6,
             "train_step_median_ms": s, "eval_share_of_wall": ev / total if total else 0.0}
    _zoo.finish("eval_phase", args, timer, truth,
                {"batch": args.batch, "eval_every": args.eval_every, "compile": args.compile,
                 "bf16": args.bf16, "foreach": args.foreach, "threads": threads})


if __name__ == "__main__":
    main()
