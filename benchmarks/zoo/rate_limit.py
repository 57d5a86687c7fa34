"""Blocked by a rate limiter: the loop holds itself to ``--rate`` steps a second (60: a 16.7 ms
period) with ``time.sleep`` until the next slot (a limiter a user added to share a machine, or
left from a demo), and its work takes ~8-9 ms a step here on a quiet machine; the model is
3 x Linear(512, 512) + a head, fp32, batch 96, SGD with momentum.

The sleep is the training thread asleep by its own choice, ~40-50% of the step when the machine
is quiet and less when other work slows the compute (the limiter gives back what the compute
takes: the step stays at the period until the work alone is longer). Truth, by the job's own
clocks: the step (mean), the time in ``time.sleep`` per step and the rest. The natural fix is to
take the limiter out (``--rate 0``): there is no wait to move off the thread, it is the point of
the code; ``--async`` is the same (accepted for the zoo's uniform knob).
"""

from __future__ import annotations

import time

import _blocked
import _zoo
import torch


def main() -> None:
    p = _zoo.parser(__doc__, steps=60, warmup=5)
    p.add_argument("--batch", type=int, default=96)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--rate", type=float, default=60.0, help="steps a second; 0: no limit")
    p.add_argument("--async", dest="use_async", action="store_true",
                   help="the same as --rate 0 (the limiter out)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(threads=1)
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    rate = 0.0 if args.use_async else args.rate
    period = 1.0 / rate if rate else 0.0
    model = _blocked.mlp(args.width, args.layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=args.foreach or None)
    x = torch.randn(args.batch, args.width)
    y = torch.randint(0, 10, (args.batch,))
    fwd = torch.compile(model) if args.compile else model
    timer = _zoo.Timer()
    next_slot = time.perf_counter()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            _blocked.train_step(model, fwd, opt, x, y)
            if period:
                next_slot += period
                with _blocked.blocked(timer):
                    now = time.perf_counter()
                    if next_slot > now:
                        time.sleep(next_slot - now)
                    else:  # late: no catching up in a burst
                        next_slot = now
    truth = {"flops_per_step": _blocked.mlp_flops(args.batch, args.width, args.layers),
             "rate": rate, "period_ms": period * 1e3,
             **_blocked.blocked_truth(args, timer, "time.sleep (a step-rate limiter)")}
    _zoo.finish("rate_limit", args, timer, truth,
                {"batch": args.batch, "rate": rate, "compile": args.compile, "threads": threads})


if __name__ == "__main__":
    main()
