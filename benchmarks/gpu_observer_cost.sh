#!/usr/bin/env bash
# What observing a job costs outside the profiler window, on a GPU: the GPT-style LM of
# benchmarks/workloads/gpu_realistic.py timed by itself (CUDA-synchronised, steps 21-200),
# run alone, under `gpudiag profile` (NVML sampling) and under `gpudiag profile --backend none`,
# alternated ROUNDS times. The window (--skip 150) is past the measured steps but for its tail.
# Prints each run's median step and the ratios against the alone run of the same round.
#     bash benchmarks/gpu_observer_cost.sh [ROUNDS]
set -eu
ROUNDS=${1:-2}
J=benchmarks/workloads/gpu_realistic.py
T=$(mktemp -d)
median() { python3 -c "import json,statistics,sys; s=json.load(open(sys.argv[1]))['step_seconds'][20:150]; print(round(statistics.median(s)*1e3,3))" "$1"; }
for i in $(seq "$ROUNDS"); do
    python3 $J --kind lm --steps 200 --report "$T/a$i.json"
    python3 -m gpudiag profile --out "$T/p$i" --skip 150 --steps 3 -- python3 $J --kind lm --steps 200 \
        --report "$T/p$i.json" > /dev/null 2>&1
    python3 -m gpudiag profile --out "$T/n$i" --backend none --skip 150 --steps 3 -- python3 $J --kind lm \
        --steps 200 --report "$T/n$i.json" > /dev/null 2>&1
    a=$(median "$T/a$i.json"); p=$(median "$T/p$i.json"); n=$(median "$T/n$i.json")
    python3 -c "a,p,n=$a,$p,$n; print(f'round $i: alone {a} ms, gpudiag (NVML) {p} ms ({p/a:.3f}x), gpudiag (no NVML) {n} ms ({n/a:.3f}x)')"
done
