"""Host-bound by a Python loop over time in the model: a GRU cell written by hand (two
Linear calls and ~10 elementwise operators a time step) unrolled over ``--seq`` steps (48) in
Python, batch 8, hidden 64, classifying the last state; Adam.

Every time step is a dozen tiny operators forward and more backward, each paying the
interpreter and the dispatcher for 8 x 64 numbers. Truth: the step at 16x the batch (the same
operators; the fixed per-step cost). Knobs: ``--compile`` (the cell's step compiled),
``--compile-model`` (the whole module compiled: the loop over time unrolled into one graph),
``--fused`` (``nn.GRU``: the loop over time in C++; same parameters and FLOPs; on this CPU at
this size measured slower, 15.9 against 12.6 ms, one run each), ``--seq`` (the loop's length).
"""

from __future__ import annotations

import _zoo
import torch
import torch.nn as nn


class HandGRU(nn.Module):
    def __init__(self, d_in: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.ih = nn.Linear(d_in, 3 * h)
        self.hh = nn.Linear(h, 3 * h)

    def step(self, x_t: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        gi = self.ih(x_t)
        gh = self.hh(state)
        i_r, i_z, i_n = gi.chunk(3, 1)
        h_r, h_z, h_n = gh.chunk(3, 1)
        r = torch.sigmoid(i_r + h_r)
        z = torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        return (1 - z) * n + z * state

    def forward(self, x: torch.Tensor, step=None) -> torch.Tensor:
        state = x.new_zeros(x.shape[0], self.h)
        f = step or self.step
        for t in range(x.shape[1]):
            state = f(x[:, t], state)
        return state


def main() -> None:
    p = _zoo.parser(__doc__, steps=40, warmup=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=48, help="time steps (the Python loop's length)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--fused", action="store_true", help="nn.GRU instead of the hand-written loop")
    p.add_argument("--compile", action="store_true", help="torch.compile the cell's step")
    p.add_argument("--compile-model", action="store_true",
                   help="torch.compile the whole recurrent module (the loop over time unrolled)")
    p.set_defaults(threads=1)
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    d_in, h = 32, args.hidden
    rnn: nn.Module = nn.GRU(d_in, h, batch_first=True) if args.fused else HandGRU(d_in, h)
    head = nn.Linear(h, 10)
    params = list(rnn.parameters()) + list(head.parameters())
    step_fn = torch.compile(rnn.step) if (args.compile and not args.fused) else None
    rnn_fwd = torch.compile(rnn) if args.compile_model else rnn
    opt = torch.optim.Adam(params, lr=1e-3, foreach=args.foreach or None)
    x = torch.randn(args.batch, args.seq, d_in)
    y = torch.randint(0, 10, (args.batch,))
    timer = _zoo.Timer()
    for _ in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            if args.fused:
                last = rnn(x)[1][0]
            else:
                last = rnn_fwd(x, step_fn)
            loss = nn.functional.cross_entropy(head(last), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    flops = 6 * args.batch * args.seq * 3 * h * (d_in + h)
    truth = {"flops_per_step": flops, "python_loop_len": 0 if args.fused else args.seq}
    _zoo.finish("rnn_loop", args, timer, truth,
                {"batch": args.batch, "seq": args.seq, "fused": args.fused,
                 "compile": args.compile, "compile_model": args.compile_model,
                 "threads": threads})


if __name__ == "__main__":
    main()
