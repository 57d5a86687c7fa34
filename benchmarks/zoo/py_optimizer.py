"""Host-bound by a hand-written optimizer: Adam written in Python, one parameter at a time
(eight small in-place operators each), over a model of 48 blocks of Linear(64, 64) +
LayerNorm(64) (194 parameter tensors, 0.2M parameters), batch 64.

The forward and backward are small; the optimizer is ~1,500 operator calls on tensors of 64
to 4,096 numbers. The loop has no ``torch.optim`` optimizer, so it marks its steps with
``gpudiag.step()`` where gpudiag is importable (its docs: loops without an optimizer).
Truth: the step at 16x the batch (the same operators; the fixed per-step cost). Fixes: the same
update by ``torch.optim.Adam(foreach=True)`` (``--builtin``) or ``fused=True`` (``--fused``);
``--compile`` (the model), ``--compile-opt`` (the model and the hand-written optimizer's step).
"""

from __future__ import annotations

import _zoo
import torch
import torch.nn as nn

try:  # a loop without a torch.optim optimizer tells gpudiag where its steps end
    from gpudiag import step as _mark_step
except ImportError:  # pragma: no cover - run without gpudiag installed
    def _mark_step() -> None:
        return None


class HandAdam:
    def __init__(self, params, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8) -> None:
        self.params = [q for q in params]
        self.m = [torch.zeros_like(q) for q in self.params]
        self.v = [torch.zeros_like(q) for q in self.params]
        self.lr, self.b1, self.b2, self.eps, self.t = lr, b1, b2, eps, 0

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        bc1 = 1 - self.b1 ** self.t
        bc2 = 1 - self.b2 ** self.t
        for q, m, v in zip(self.params, self.m, self.v, strict=True):
            g = q.grad
            m.mul_(self.b1).add_(g, alpha=1 - self.b1)
            v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
            denom = (v / bc2).sqrt_().add_(self.eps)
            q.addcdiv_(m, denom, value=-self.lr / bc1)

    def zero_grad(self) -> None:
        for q in self.params:
            q.grad = None


def main() -> None:
    p = _zoo.parser(__doc__, steps=60, warmup=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--blocks", type=int, default=48)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--builtin", action="store_true",
                   help="torch.optim.Adam(foreach=True) instead of the hand-written loop")
    p.add_argument("--fused", action="store_true",
                   help="torch.optim.Adam(fused=True) (one fused kernel a tensor on the CPU)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--compile-opt", action="store_true",
                   help="also torch.compile the hand-written optimizer's step")
    p.set_defaults(threads=1)
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    w = args.width
    layers: list[nn.Module] = []
    for _ in range(args.blocks):
        layers += [nn.Linear(w, w), nn.LayerNorm(w), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(w, 10))
    args.builtin = args.builtin or args.fused
    opt = (torch.optim.Adam(model.parameters(), lr=1e-3, fused=True) if args.fused
           else torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True) if args.builtin
           else HandAdam(model.parameters(), lr=1e-3))
    x = torch.randn(args.batch, w)
    y = torch.randint(0, 10, (args.batch,))
    fwd = torch.compile(model) if (args.compile or args.compile_opt) else model
    if args.compile_opt and not args.builtin:
        opt.step = torch.compile(opt.step)
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            loss = nn.functional.cross_entropy(fwd(x), y)
            if args.builtin:
                opt.zero_grad(set_to_none=True)
            else:
                opt.zero_grad()
            loss.backward()
            with timer.part("optimizer"):
                opt.step()
        if not args.builtin:
            _mark_step()
    n_tensors = sum(1 for _ in model.parameters())
    flops = 6 * args.batch * (args.blocks * w * w + w * 10)
    truth = {"flops_per_step": flops, "param_tensors": n_tensors,
             "optimizer_ms": _zoo.median(timer.parts["optimizer"][args.warmup:])}
    _zoo.finish("py_optimizer", args, timer, truth,
                {"batch": args.batch, "builtin": args.builtin, "fused": args.fused,
                 "compile": args.compile, "compile_opt": args.compile_opt,
                 "threads": threads})


if __name__ == "__main__":
    main()
