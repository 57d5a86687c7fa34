"""Host syncs every few ops: a small MLP whose loop reads values back to Python as it goes.

After each hidden layer the loop checks the activations (``.abs().max().item()``) and keeps
their mean (``.mean().cpu()``), and it logs the loss with ``.item()`` each step: on a GPU
every one of these waits for the device; on a CPU each costs the host work of the call.
``--no-syncs`` runs the same model without them (the fix applied). Prints the job's own
median step time.

    python benchmarks/workloads/sync_heavy.py --steps 200 [--no-syncs] [--device cuda]
"""

from __future__ import annotations

import argparse

import torch
from own_timer import StepTimer
from torch import nn

WIDTH, DEPTH, BATCH = 256, 24, 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--no-syncs", action="store_true", help="the fix: no values read back")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one core: the same work whatever else runs on the machine
    dev = torch.device(args.device)
    layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)).to(dev)
    head = nn.Linear(WIDTH, 1).to(dev)
    opt = torch.optim.SGD([*layers.parameters(), *head.parameters()], lr=1e-3)
    x, y = torch.randn(BATCH, WIDTH, device=dev), torch.randn(BATCH, 1, device=dev)
    timer = StepTimer()
    peaks: list[float] = []
    means: list[torch.Tensor] = []
    losses: list[float] = []
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        h = x
        for layer in layers:
            h = torch.relu(layer(h))
            if not args.no_syncs:
                peaks.append(h.abs().max().item())
                means.append(h.mean().cpu())
        loss = nn.functional.mse_loss(head(h), y)
        loss.backward()
        opt.step()
        if not args.no_syncs:
            losses.append(loss.item())
        if dev.type == "cuda":
            torch.cuda.synchronize()  # the timer's own: a step ends when its work is done
        timer.tick()
        peaks.clear()
        means.clear()
    timer.report("sync_heavy" + (" (no syncs)" if args.no_syncs else ""))


if __name__ == "__main__":
    main()
