#!/usr/bin/env bash
# The embedded scheduler on a real GPU machine: --gpus all from NVML, CUDA_VISIBLE_DEVICES per
# job, a job asking for more GPUs than the machine has refused, and the agent attributing the
# job's GPU process to it. Prints what it saw; needs NVIDIA GPUs and gpudiag importable.
#     bash benchmarks/gpu_scheduler_check.sh
set -u
export GPUDIAG_SIGNAL_INTERVAL=2  # jobs report every 2 s here (15 s by default)
S=$(mktemp -d)/sched
A=$(mktemp -d)/agent
N=$(nvidia-smi -L | wc -l)
echo "GPUs on this machine: $N"
python3 -m gpudiag agent --listen 127.0.0.1:9835 --state-dir "$A" > "$A.log" 2>&1 &
AGENT=$!
# the daemon asks the agent at --agent-url for its folder (its jobs report there): agent first
for _ in $(seq 100); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:9835/metrics')" 2>/dev/null && break
    sleep 0.2
done
python3 -m gpudiag scheduler serve --state-dir "$S" --gpus all --min-runtime 0 \
    --agent-url http://127.0.0.1:9835/metrics > "$S.log" 2>&1 &
DAEMON=$!
for _ in $(seq 50); do [ -S "$S/sock" ] && break; sleep 0.2; done
JOB='import os, time, torch; x = torch.randn(8192, 8192, device="cuda"); print("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"), "devices", torch.cuda.device_count(), "GPUDIAG_JOB", os.environ.get("GPUDIAG_JOB"), flush=True)
opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1, device="cuda"))], lr=0.1)
for i in range(1000):
    y = x @ x; opt.step(); torch.cuda.synchronize()
print("done", flush=True)'
ID=$(python3 -m gpudiag submit --state-dir "$S" --gpus 1 --name gpu-check -- python3 -c "$JOB")
echo "submitted job $ID"
python3 -m gpudiag submit --state-dir "$S" --gpus $((N + 1)) -- true; echo "exit code for $((N + 1)) GPUs: $?"
for _ in $(seq 150); do
    python3 -m gpudiag queue --state-dir "$S" --all --json | grep -q '"state": "running"' && break; sleep 0.4
done
sleep 8  # the job reports to the agent while it runs
python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9835/metrics').read().decode())" \
    | grep -E '^gpudiag_(job_mfu_ratio|job_bottleneck|job_signal_confidence)' | head -6
python3 -m gpudiag queue --state-dir "$S"
for _ in $(seq 150); do
    python3 -m gpudiag queue --state-dir "$S" --all --json | grep -q '"state": "done"' && break; sleep 0.4
done
python3 -m gpudiag queue --state-dir "$S" --all
python3 -m gpudiag logs --state-dir "$S" "$ID" | grep -E "CUDA_VISIBLE|VERDICT|^MFU|done"
python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9835/metrics').read().decode())" \
    | grep -E '^gpudiag_(gpu_sm_activity_ratio|job_mfu_ratio|job_bottleneck|gpu_up|job_signal)' | head -12
kill $DAEMON $AGENT; wait
tail -3 "$S.log"
