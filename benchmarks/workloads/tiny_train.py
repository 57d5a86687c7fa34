"""gpudiag's default demo: a tiny MLP classifier trained on synthetic data, on the CPU.

    python benchmarks/workloads/tiny_train.py --profile-out /tmp/demo
    gpudiag analyze /tmp/demo

Runs in about a second. Labels come from a fixed random "teacher" network, so the loss
falls as the model learns.
"""

from __future__ import annotations

import torch
from _common import PROFILED_STEPS, maybe_profile, parse_args
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAMPLES, FEATURES, HIDDEN, CLASSES = 4096, 32, 128, 10
BATCH, EPOCHS = 64, 3


def make_data() -> TensorDataset:
    x = torch.randn(SAMPLES, FEATURES)
    teacher = torch.randn(FEATURES, CLASSES)
    y = (x @ teacher).argmax(dim=1)
    return TensorDataset(x, y)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    loader = DataLoader(make_data(), batch_size=BATCH, shuffle=True, drop_last=True)
    assert EPOCHS * len(loader) >= PROFILED_STEPS
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    loss = torch.tensor(float("nan"))
    with maybe_profile(args.profile_out) as prof:
        for _ in range(EPOCHS):
            for x, y in loader:
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                prof.step()
    print(f"tiny_train: final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
