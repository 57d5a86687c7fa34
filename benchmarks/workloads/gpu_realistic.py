"""Realistic GPU training jobs with their own truth: analytic FLOPs and their own step timer.

    python gpu_realistic.py --kind lm|cnn [--steps 60] [--report FILE] [--small]

lm   GPT-style decoder: 12 layers, d=768, 12 heads, causal scaled_dot_product_attention,
     S=512, B=16, vocab 32768, bf16 autocast, fused AdamW. Analytic FLOPs per step (model
     FLOPs, PaLM's definition): B*S * (L * (72 d^2 + 6 S d) + 6 d V), i.e. 6 FLOPs per
     parameter per token for the matmuls plus causal attention's half of 12 S d per layer.
cnn  ResNet-50 (torchvision, random init), batch 128, channels_last, bf16 autocast, SGD with
     momentum, fed by a 12-worker DataLoader doing CPU augmentation (random resized crop,
     flip, normalise) of synthetic images. ``--workers/--batch/--size/--jitter`` change the
     loader: ``--workers 0 --batch 64 --size 320 --jitter`` is the H200 ``resnet_w0`` recording's
     job (augmentation in the training process, ColorJitter included), whose fix is the workers.
     Analytic FLOPs per step: every convolution and linear layer's 2 * MACs from its output
     shape (forward hooks on one dry run), times 3 for forward + backward, less the first
     convolution's input gradient, which autograd never computes.

Every step is timed by the job itself, CUDA-synchronised at its end (the job's truth: no
profiler is involved in it); the time spent waiting for the DataLoader is timed apart.
``--report`` receives {"analytic_flops_per_step", "step_seconds", "input_wait_seconds",
"t_end"} (``t_end``: unix time after the last step, to time the job's exit against).
``--small`` shrinks both models to run in seconds on a CPU (a dry run of this script; the CNN
becomes a ResNet-18 on 64 px images, whatever ``--size``/``--batch`` say).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


class LM(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.blocks(self.emb(idx))))


def lm_job(dev: str, small: bool):
    v, d, layers, heads, s, b = (512, 64, 2, 4, 64, 4) if small else (32768, 768, 12, 12, 512, 16)
    model = LM(v, d, layers, heads).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
    x = torch.randint(0, v, (b, s), device=dev)
    y = torch.randint(0, v, (b, s), device=dev)
    flops = b * s * (layers * (72 * d * d + 6 * s * d) + 6 * d * v)

    def step() -> float:
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return 0.0

    return step, flops


class Images(torch.utils.data.Dataset):
    def __init__(self, size: int, jitter: bool = False) -> None:
        from torchvision.transforms import v2

        self.size = size
        colour = [v2.ColorJitter(0.4, 0.4, 0.4)] if jitter else []
        self.tf = v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip(), *colour,
                              v2.ToDtype(torch.float32, scale=True),
                              v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        img = torch.randint(0, 256, (3, self.size + self.size // 7, self.size + self.size // 7),
                            dtype=torch.uint8, generator=g)
        return self.tf(img), i % 1000


def conv_linear_flops(model: nn.Module, sample: torch.Tensor) -> tuple[float, float]:
    """(forward FLOPs per sample, the first conv's forward FLOPs) from each layer's output shape."""
    per: list[float] = []

    def hook(mod: nn.Module, inp, out) -> None:
        if isinstance(mod, nn.Conv2d):
            kh, kw = mod.kernel_size
            per.append(2.0 * out[0].numel() * (mod.in_channels // mod.groups) * kh * kw)
        elif isinstance(mod, nn.Linear):
            per.append(2.0 * out[0].numel() * mod.in_features)

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        model(sample[:1])
    for h in handles:
        h.remove()
    return sum(per), per[0]


def cnn_job(dev: str, small: bool, loader: argparse.Namespace):
    import torchvision

    size, batch, workers = (64, 4, 2) if small else (224, 128, 12)
    if not small:
        size, batch = loader.size or size, loader.batch or batch
    workers = workers if loader.workers is None else loader.workers
    net = torchvision.models.resnet18 if small else torchvision.models.resnet50
    model = net().to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    extra = {"persistent_workers": True, "prefetch_factor": 4} if workers else {}
    dl = torch.utils.data.DataLoader(Images(size, loader.jitter), batch_size=batch, num_workers=workers,
                                     pin_memory=dev == "cuda", **extra)
    it = iter(dl)
    fwd, first = conv_linear_flops(model, torch.zeros(1, 3, size, size, device=dev))
    flops = batch * (3 * fwd - first)

    def step() -> float:
        t = time.perf_counter()
        xb, yb = next(it)
        wait = time.perf_counter() - t
        xb = xb.to(dev, non_blocking=True).to(memory_format=torch.channels_last)
        yb = yb.to(dev, non_blocking=True)
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return wait

    step.loader_iter = it  # for --close-loader
    return step, flops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=("lm", "cnn"), required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--report", default=None)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--workers", type=int, default=None, help="cnn: DataLoader workers (default 12)")
    ap.add_argument("--batch", type=int, default=None, help="cnn: batch size (default 128)")
    ap.add_argument("--size", type=int, default=None, help="cnn: image side after the crop (default 224)")
    ap.add_argument("--jitter", action="store_true", help="cnn: ColorJitter in the augmentation too")
    ap.add_argument("--close-loader", action="store_true",
                    help="cnn: shut the DataLoader's workers down after the last step, not at exit")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    step, flops = lm_job(dev, args.small) if args.kind == "lm" else cnn_job(dev, args.small, args)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    times, waits = [], []
    for _ in range(args.steps):
        sync()
        t = time.perf_counter()
        waits.append(step())
        sync()
        times.append(time.perf_counter() - t)
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"analytic_flops_per_step": flops, "step_seconds": times,
                       "input_wait_seconds": waits, "t_end": time.time()}, f)
    shutdown = getattr(getattr(step, "loader_iter", None), "_shutdown_workers", None)
    if args.close_loader and shutdown is not None:
        shutdown()


if __name__ == "__main__":
    main()
