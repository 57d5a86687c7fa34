"""Does a training loop run faster after a torch profiler session than before it, without gpudiag?

Blind set 6 (benchmarks/zoo/results/held-out-6-2026-11-29.md, finding 7) found jobs 6-17% faster
by their own timer in the steps after gpudiag's trace window than alone, the steps before it as
alone; gpudiag reads its untraced steps on both sides of the window, so its step read 3-6% under
the job's pace. This script asks whether torch alone does it: in fresh processes, a small CPU
training loop (MLP blocks with LayerNorm, Adam one tensor at a time, one thread) times its steps,
then either runs an empty ``torch.profiler.profile()`` session (start and stop, nothing inside)
or does nothing, then times its steps again; it prints each process' after/before ratio of
median steps and the two forms' medians, alternated ``--rounds`` times.

    python benchmarks/after_profiler_pace.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CHILD = r"""
import statistics, sys, time, torch
torch.set_num_threads(1); torch.manual_seed(0)
layers = []
for _ in range(24):
    layers += [torch.nn.Linear(128, 128), torch.nn.LayerNorm(128), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers)
opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
x, y = torch.randn(32, 128), torch.randn(32, 128)

def step():
    t = time.perf_counter()
    torch.nn.functional.mse_loss(model(x), y).backward(); opt.step(); opt.zero_grad()
    return time.perf_counter() - t

for _ in range(10):
    step()
before = statistics.median(step() for _ in range(40))
if sys.argv[1] == "profiler":
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        pass
after = statistics.median(step() for _ in range(40))
print(after / before)
"""


def ratio(form: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, form], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the two forms (default 3)")
    args = ap.parse_args()
    runs: dict[str, list[float]] = {"nothing": [], "profiler": []}
    for _ in range(args.rounds):
        for form in runs:
            runs[form].append(ratio(form))
    for form, rs in runs.items():
        print(f"{form:>9} between: after/before {statistics.median(rs):.3f} "
              f"(each process: {', '.join(f'{r:.3f}' for r in rs)})")
    print(f"ratio, an empty profiler session against nothing: "
          f"{statistics.median(runs['profiler']) / statistics.median(runs['nothing']):.3f}")


if __name__ == "__main__":
    main()
