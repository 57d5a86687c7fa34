"""A CPU training job with known host syncs per step, each on a line marked ``# sync:``.

Per step: ``.item()`` on each of 3 layers' activations (fed by ``abs`` and ``max``, computed for
nothing else) inside the model's forward (an ``nn.Module``); then, in the training loop,
``.cpu()`` of 2 means, ``bool()`` of a comparison, ``.tolist()`` of a slice, one boolean-mask
index, a nonfinite check inside ``clip_grad_norm_`` (a sync in torch's code, called from the
marked line) and the loss's ``.item()``: the census must find each, at its line, as often as it
runs. The batches come from a DataLoader whose dataset calls ``.tolist()`` making each sample:
input work, not a sync of the step (marked ``# not a sync``). ``--syncs 0`` leaves the syncs
out (the fix applied). ``--adam``: torch.optim.Adam, whose step reads each parameter's step
counter back with ``.item()`` on a CPU: torch.optim's syncs, none of the job's.

    python sync_job.py --steps 40 [--syncs 0] [--adam]
"""

import argparse

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--syncs", type=int, default=1)
ap.add_argument("--adam", action="store_true")
args = ap.parse_args()



class Samples(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16 * args.steps

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        values = torch.randn(64).tolist()  # not a sync: dataset
        return torch.tensor(values), torch.randn(64)


class Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(3))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            h = torch.tanh(layer(h))
            if args.syncs:
                seen.append(h.abs().max().item())  # sync: item-per-layer
        return h


torch.manual_seed(0)
torch.set_num_threads(1)
layers = Stack()
opt = (torch.optim.Adam if args.adam else torch.optim.SGD)(layers.parameters(), lr=1e-3)
seen = []
for x, y in torch.utils.data.DataLoader(Samples(), batch_size=16):
    opt.zero_grad(set_to_none=True)
    h = layers(x)
    if args.syncs:
        means = [h.mean().cpu() for _ in range(2)]  # sync: cpu-means
        if (h > 0.99).any():  # sync: bool-check
            seen.append(0.0)
        seen.append(h[0, :4].tolist())  # sync: tolist
        seen.append(h[h > 0].numel())  # sync: mask-index
    loss = torch.nn.functional.mse_loss(h, y)
    loss.backward()
    if args.syncs:
        torch.nn.utils.clip_grad_norm_(layers.parameters(), 1.0, error_if_nonfinite=True)  # sync: clip
    opt.step()
    if args.syncs:
        seen.append(loss.item())  # sync: loss-item
    seen.clear()
print("sync_job: done", flush=True)
