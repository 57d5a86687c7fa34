"""Host-bound by per-step logging: after every step the loop reads each parameter's gradient
and weight norm with ``.item()``, a 64-bin histogram of each weight with ``.tolist()``, and
writes them as one JSON line to a log file, flushed and ``os.fsync``-ed (the pattern of a
hand-rolled metrics logger), on 6 x Linear(512, 512), batch 64, SGD.

The model's step is a few ms of GEMMs; the logging is 14 tensors x (2 norms + 1 histogram) of
reductions and host reads, JSON encoding and a synchronous disk flush. Truth: the step with
logging every ``--log-every`` steps (0: never), alternated; the logging's share is
1 - (step without logging) / step (mean step: logging every N lands in one step in N).
"""

from __future__ import annotations

import json
import os
import tempfile

import _zoo
import torch
import torch.nn as nn


def log_metrics(model: nn.Module, f, step: int, loss: torch.Tensor) -> int:
    """One metrics record; returns how many host reads (.item()/.tolist()) it made."""
    rec: dict = {"step": step, "loss": loss.item()}
    reads = 1
    for name, q in model.named_parameters():
        rec[f"{name}.grad_norm"] = q.grad.norm().item()
        rec[f"{name}.norm"] = q.detach().norm().item()
        rec[f"{name}.hist"] = torch.histc(q.detach(), bins=64).tolist()
        reads += 3
    f.write(json.dumps(rec) + "\n")
    f.flush()
    os.fsync(f.fileno())
    return reads


def main() -> None:
    p = _zoo.parser(__doc__, steps=60, warmup=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--log-every", type=int, default=1, help="log every N steps; 0: never")
    p.add_argument("--log-dir", default="", help="where the log goes (default: a temp dir)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(threads=1)
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    w = args.width
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(w, w), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(w, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9,
                          foreach=args.foreach or None)
    x = torch.randn(args.batch, w)
    y = torch.randint(0, 10, (args.batch,))
    d = args.log_dir or tempfile.mkdtemp(prefix="metrics_log-")
    f = open(os.path.join(d, f"metrics-{os.getpid()}.jsonl"), "w")
    fwd = torch.compile(model) if args.compile else model
    timer = _zoo.Timer()
    reads = 0
    for i in range(args.steps):
        if timer.over(args):
            break
        with timer.step():
            loss = nn.functional.cross_entropy(fwd(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if args.log_every and i % args.log_every == 0:
                with timer.part("log"):
                    reads += log_metrics(model, f, i, loss)
            opt.step()
    f.close()
    os.unlink(f.name)
    n = len(timer.steps_ms)
    flops = 6 * args.batch * (args.layers * w * w + w * 10)
    truth = {"flops_per_step": flops, "host_reads_per_step": reads / max(n, 1),
             "log_ms_mean": sum(timer.parts.get("log", [0.0])[args.warmup:])
             / max(n - args.warmup, 1)}
    _zoo.finish("metrics_log", args, timer, truth,
                {"batch": args.batch, "log_every": args.log_every, "compile": args.compile,
                 "threads": threads})


if __name__ == "__main__":
    main()
