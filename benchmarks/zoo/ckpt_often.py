"""Checkpoint-dominated: a recommender-style model (a 400k x 64 embedding table with sparse
gradients, 25.6M parameters: ~100 MB, and a small MLP), plain SGD, batch 64 bags of 16, that
``torch.save``s the model and optimizer every 4 steps.

A training step touches ~1k rows of the table (sparse gradient, sparse update): a few ms. The
save pickles and writes the whole table, every time. Truth: the mean
step against ``--ckpt-every 0`` (never save), alternated, and the save's own time.
Knobs: ``--ckpt-every N`` (save less often), ``--ckpt-thread`` (write from a thread).
"""

from __future__ import annotations

import os
import tempfile
import threading

import _zoo
import torch
import torch.nn as nn

ROWS = 400_000


class Net(nn.Module):
    def __init__(self, w: int) -> None:
        super().__init__()
        self.emb = nn.EmbeddingBag(ROWS, 64, mode="mean", sparse=True)
        self.inp = nn.Linear(64, w)
        self.body = nn.Sequential(*[m for _ in range(2) for m in (nn.Linear(w, w), nn.ReLU())])
        self.out = nn.Linear(w, 10)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(torch.relu(self.inp(self.emb(idx)))))


def main() -> None:
    p = _zoo.parser(__doc__, steps=40, warmup=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--ckpt-every", type=int, default=4, help="0: never save")
    p.add_argument("--ckpt-dir", default="", help="where to save (default: a temporary folder)")
    p.add_argument("--ckpt-thread", action="store_true",
                   help="clone the state in the step, write it from a background thread")
    p.set_defaults(threads=1)  # one intra-op thread: see the held-out-2 README section
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    w = 256
    model = Net(w)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, foreach=args.foreach or None)
    idx = torch.randint(0, ROWS, (args.batch, 16))
    y = torch.randint(0, 10, (args.batch,))
    tmp = tempfile.TemporaryDirectory(dir=args.ckpt_dir or None, prefix="zoo-ckpt2-")
    path = os.path.join(tmp.name, "ckpt.pt")
    writer: threading.Thread | None = None
    timer = _zoo.Timer()
    for i in range(args.steps):
        if timer.over(args):
            break
        save = bool(args.ckpt_every) and (i + 1) % args.ckpt_every == 0
        with timer.step("save" if save else "train"):
            loss = nn.functional.cross_entropy(model(idx), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if save:
                with timer.part("save"):
                    state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": i}
                    if args.ckpt_thread:
                        if writer is not None:
                            writer.join()
                        snap = {"model": {k: v.clone() for k, v in state["model"].items()},
                                "opt": {"state": {k: {n: t.clone() if torch.is_tensor(t) else t
                                                      for n, t in s.items()}
                                                  for k, s in state["opt"]["state"].items()},
                                        "param_groups": state["opt"]["param_groups"]},
                                "step": i}
                        writer = threading.Thread(target=torch.save, args=(snap, path))
                        writer.start()
                    else:
                        torch.save(state, path)
    if writer is not None:
        writer.join()
    size_mb = os.path.getsize(path) / 2**20 if os.path.exists(path) else 0.0
    tmp.cleanup()
    keep = range(args.warmup, len(timer.steps_ms))
    saves = [timer.parts["save"][j] for j in keep if timer.kinds[j] == "save"] \
        if "save" in timer.parts else []
    mean = sum(timer.steps_ms[j] for j in keep) / max(len(keep), 1)
    params = sum(q.numel() for q in model.parameters())
    truth = {"ckpt_mb": size_mb, "params": params,
             "save_ms_median": _zoo.median(saves) if saves else 0.0,
             "save_share_of_mean_step": (sum(saves) / len(keep)) / mean if saves else 0.0}
    _zoo.finish("ckpt_often", args, timer, truth,
                {"batch": args.batch, "ckpt_every": args.ckpt_every,
                 "ckpt_thread": args.ckpt_thread, "foreach": args.foreach, "threads": threads})


if __name__ == "__main__":
    main()
