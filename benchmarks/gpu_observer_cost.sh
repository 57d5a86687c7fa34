#!/usr/bin/env bash
# What observing a job costs it, by its own timer, over the whole run, on a GPU: the GPT-style
# LM of benchmarks/workloads/gpu_realistic.py (CUDA-synchronised step times) run alone and under
#   prof     gpudiag profile (window at --skip 20, then the rest of the run: the after-effect counts)
#   mon      gpudiag profile --monitor (always-on mode: a 2-step window at step 10)
# each with CUPTI teardown (--cupti-teardown auto, the default) and without it (off: torch's
# default, CUPTI left attached after the window). The five runs of a round go A..E, the next
# round E..A (ABBA), so a drift of the machine cancels. Per run: the sum and median of the job's
# own step times from step 21 to the end (traced steps included: the whole run's cost), the
# median of the steps after the window's end, and the time from the job's last step to its
# exit. Ratios are against the alone run of the same round.
#     bash benchmarks/gpu_observer_cost.sh [ROUNDS] [STEPS] [--small]   # defaults: 2 rounds, 400 steps
# --small: the LM shrunk to run in seconds on a CPU (a dry run of the script, no CUPTI there).
# KIND=cnn (environment): the ResNet-50 behind 12 persistent, pinned DataLoader workers instead,
# whose "exit" column says whether the job's end waits on its workers alone as under gpudiag
# (an H200 run of such a job sat idle 70 s after its last step: docs/benchmarks.md); it needs
# torchvision.
set -eu
ROUNDS=${1:-2}
STEPS=${2:-400}
SMALL=${3:-}
PY=${PYTHON:-python3}
J="benchmarks/workloads/gpu_realistic.py"
[ "$SMALL" = "--small" ] && J="$J --small"
KIND=${KIND:-lm}
T=$(mktemp -d)
trap 'echo "run directories and reports: $T"' EXIT
run() {  # name round: one run, its report in $T/<name><round>.json, its exit time beside it
    local name=$1 i=$2 out="$T/$1$2"
    case $name in
        alone) $PY $J --kind $KIND --steps "$STEPS" --report "$out.json"; date +%s.%N > "$out.exit" ;;
        prof-*) $PY -m gpudiag profile --out "$out" --backend none --skip 20 --steps 5 \
                    --cupti-teardown "${name#prof-}" -- $PY $J --kind $KIND --steps "$STEPS" \
                    --report "$out.json" > "$out.log" 2>&1 ;;
        mon-*) $PY -m gpudiag profile --out "$out" --backend none --monitor \
                   --cupti-teardown "${name#mon-}" -- $PY $J --kind $KIND --steps "$STEPS" \
                   --report "$out.json" > "$out.log" 2>&1 ;;
    esac
}
NAMES=(alone prof-auto prof-off mon-auto mon-off)
for i in $(seq "$ROUNDS"); do
    order=("${NAMES[@]}")
    if [ $((i % 2)) -eq 0 ]; then order=(mon-off mon-auto prof-off prof-auto alone); fi
    for n in "${order[@]}"; do run "$n" "$i"; done
    $PY - "$T" "$i" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
t, i = Path(sys.argv[1]), sys.argv[2]
def stats(name):
    rep = json.loads((t / f"{name}{i}.json").read_text())
    s = rep["step_seconds"][20:]
    run = t / f"{name}{i}"
    if (run / "run.json").exists():
        info = json.loads((run / "run.json").read_text())
        end = info["end"]
        boot = json.loads((run / "samples" / "bootstrap-rank-0.json").read_text())
        last = max(boot.get("traced_steps") or [0]) + 1  # the export step
        after = rep["step_seconds"][last:]
        cupti = (info.get("cupti_teardown") or {}).get("ranks", {}).get("0", {})
    else:
        end = float((t / f"{name}{i}.exit").read_text())
        after, cupti = rep["step_seconds"][20:], {}
    return sum(s), statistics.median(s), statistics.median(after), end - rep["t_end"], cupti
a = stats("alone")
print(f"round {i} (steps 21-end; ratios against alone)")
for name in ("alone", "prof-auto", "prof-off", "mon-auto", "mon-off"):
    total, med, after, exit_s, cupti = stats(name)
    print(f"  {name:9s} total {total:7.3f} s ({total / a[0]:.3f}x)  median {1e3 * med:6.2f} ms "
          f"({med / a[1]:.3f}x)  after the window {1e3 * after:6.2f} ms ({after / a[2]:.3f}x)  "
          f"exit {exit_s:5.2f} s  CUPTI torn down: {cupti.get('teardown', '-')}")
PYEOF
done
