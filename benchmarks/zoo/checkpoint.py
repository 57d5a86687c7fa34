"""Checkpoint-heavy: ``torch.save`` of the model and Adam's state (~150 MB) every 4 steps.

A 12.6M-parameter MLP (3 GEMMs of 2048x2048, batch 64) whose training loop saves a full
checkpoint in the step every ``--ckpt-every`` steps. The save is host work no operator shows.
Truth: the mean step (the save lands in one step in N) against the same job with
``--ckpt-every 0``, alternated, and the save's own time in the steps that save.
"""

from __future__ import annotations

import os
import tempfile
import threading

import _zoo
import torch
import torch.nn as nn


def main() -> None:
    p = _zoo.parser(__doc__, steps=120, warmup=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--ckpt-every", type=int, default=4, help="0: never save")
    p.add_argument("--ckpt-dir", default="", help="where to save (default: a temporary folder)")
    p.add_argument("--ckpt-thread", action="store_true",
                   help="copy the state in the step, write it from a background thread")
    p.add_argument("--bf16", action="store_true", help="torch.autocast(cpu, bfloat16)")
    args = p.parse_args()
    threads = _zoo.setup_threads(args.threads)
    torch.manual_seed(args.seed)
    d = 2048
    model = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU(),
                          nn.Linear(d, d))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=args.foreach or None)
    x = torch.randn(args.batch, d)
    y = torch.randn(args.batch, d)
    tmp = tempfile.TemporaryDirectory(dir=args.ckpt_dir or None, prefix="zoo-ckpt-")
    path = os.path.join(tmp.name, "ckpt.pt")
    writer: threading.Thread | None = None
    timer = _zoo.Timer()
    for i in range(args.steps):
        if timer.over(args):
            break
        with timer.step("save" if args.ckpt_every and (i + 1) % args.ckpt_every == 0
                        else "train"):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                out = model(x)
            loss = nn.functional.mse_loss(out.float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if args.ckpt_every and (i + 1) % args.ckpt_every == 0:
                with timer.part("save"):
                    state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": i}
                    if args.ckpt_thread:
                        if writer is not None:
                            writer.join()
                        snap = {"model": {k: v.clone() for k, v in state["model"].items()},
                                "opt": {"state": {k: {n: t.clone() if torch.is_tensor(t)
                                                      else t for n, t in s.items()}
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
    truth = {"ckpt_mb": size_mb, "save_ms_median": _zoo.median(saves) if saves else 0.0,
             "save_share_of_mean_step": (sum(saves) / len(keep)) / mean if saves else 0.0,
             "flops_per_step": 6 * args.batch * 3 * d * d}
    _zoo.finish("checkpoint", args, timer, truth,
                {"batch": args.batch, "ckpt_every": args.ckpt_every,
                 "ckpt_thread": args.ckpt_thread, "bf16": args.bf16, "foreach": args.foreach,
                 "threads": threads})


if __name__ == "__main__":
    main()
