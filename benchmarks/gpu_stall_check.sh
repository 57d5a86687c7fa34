#!/usr/bin/env bash
# The stall watch with NCCL on a GPU, and what it costs there, in one short run (docs/stall.md):
#   1. a 2-rank NCCL job whose rank 1 sleeps before an all_reduce, under gpudiag profile
#      --stall-after 5s (on a one-GPU machine both ranks share the GPU, where NCCL allows it);
#   2. a 1-rank NCCL job that finishes training and sleeps: the verdict with NVML's GPU activity;
#   3. the Flight Recorder dump of a 1-rank NCCL job, read by gpudiag hang-report;
#   4. benchmarks/stall_watch_cost.py with gloo (2 ranks, the CPU) and NCCL (1 rank, the GPU).
#     bash benchmarks/gpu_stall_check.sh [OUT_DIR]       # BACKEND=gloo: a dry run on a CPU
# gpudiag is used from this checkout without installing it (its package layout made of links).
set -u
OUT=${1:-${OUT:-/tmp/gpu-stall}}
PY=${PYTHON:-python3}
BACKEND=${BACKEND:-nccl}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
T=$(mktemp -d)
P=$(mktemp -d)
mkdir "$P/gpudiag"
cp -r gpudiag/. "$P/gpudiag/"
for d in collectors analyzers reports agent scheduler; do ln -s "$PWD/$d" "$P/gpudiag/$d"; done
export PYTHONPATH="$P${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 GPUDIAG_AGENT_DIR=/nonexistent
exec > >(tee "$OUT/log.txt") 2>&1
echo "== machine"; nvidia-smi -L 2>/dev/null; nproc; uptime
$PY -c "import torch, gpudiag.commands.profile, gpudiag.reports.incident; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count())" || exit 1

stall() {  # NAME SECONDS CMD...: gpudiag profile until its first incident (or the deadline), then stop it
    local name=$1 limit=$2; shift 2
    $PY -m gpudiag profile --out "$T/$name" --skip 1000 --stall-after 5s -- "$@" > "$T/$name.log" 2>&1 &
    local pid=$! i=0
    while [ $i -lt "$limit" ] && kill -0 $pid 2>/dev/null && [ ! -e "$T/$name/incidents/1/incident.json" ]; do
        sleep 1; i=$((i + 1))
    done
    sleep 1; kill -TERM $pid 2>/dev/null; wait $pid
    grep -v "^W\|OMP_NUM" "$T/$name.log" | grep -E "gpudiag|HUNG|IDLE|DESYNC|EXITED|BUSY|Error|error" | head -20
    for f in "$T/$name"/incidents/*/incident.json; do [ -e "$f" ] && cp "$f" "$OUT/$name-$(basename "$(dirname "$f")").json"; done
}
TR="$PY -m torch.distributed.run --master_addr 127.0.0.1 --master_port"
echo "== 1. 2-rank $BACKEND: rank 1 sleeps before an all_reduce"
stall hang2 90 $TR 29611 --nproc_per_node 2 tests/jobs/hang_job.py --backend "$BACKEND" --mode sleep --rank 1 --at 4
echo "== 2. 1-rank $BACKEND: trains, then sleeps holding its GPU"
stall idle1 90 $PY tests/jobs/hang_job.py --backend "$BACKEND" --mode idle --steps 20
echo "== 3. a Flight Recorder dump of a 1-rank $BACKEND job, read by hang-report"
mkdir -p "$T/dumps"
TORCH_FR_BUFFER_SIZE=200 $PY tests/jobs/hang_job.py --backend "$BACKEND" --mode sleep --rank 0 --at 6 \
    --fr-dump "$T/dumps" > "$T/dump.log" 2>&1 &
DP=$!
for i in $(seq 60); do [ -e "$T/dumps/nccl_trace_rank_0" ] && break; sleep 1; done
kill -9 $DP 2>/dev/null; wait $DP 2>/dev/null
$PY -m gpudiag hang-report "$T/dumps" --json > "$OUT/dump-report.json"; echo "hang-report exit $?"
$PY - "$T/dumps/nccl_trace_rank_0" <<'PYEOF'
import sys
from pathlib import Path
from gpudiag.collectors.fr_dumps import load_dump
from gpudiag.collectors.stall_collect import fr_collectives
d = load_dump(Path(sys.argv[1]))
colls, status = fr_collectives(d)
print("FR version", d.get("version"), "entries", len(d["entries"]), "status", status)
print("last entries:", [(c.pg, c.seq, c.op, c.shape, c.state) for c in colls[-4:]])
print("raw keys:", sorted(d["entries"][-1]) if d["entries"] else None)
PYEOF
echo "== 4. cost of the stall watch and the Flight Recorder on a steady job"
$PY benchmarks/stall_watch_cost.py --rounds "$ROUNDS" --steps 300 --ranks 2 --backend gloo --json "$OUT/cost-gloo.json"
if [ "$BACKEND" = nccl ]; then
    $PY benchmarks/stall_watch_cost.py --rounds "$ROUNDS" --steps 300 --ranks 1 --backend nccl --json "$OUT/cost-nccl.json"
fi
echo "== done"; uptime
