#!/usr/bin/env bash
# System packages the tests drive for real, from Debian: chromium (the HTML reports are
# opened headless), prometheus with promtool (the agent is scraped by a real server), and
# slurm-wlm with munge (tests/system/slurm/test_slurm.py starts munged, slurmctld and slurmd on 127.0.0.1),
# and tmux (tests/system/agent/test_top.py drives `gpudiag top` in a real terminal).
# Installs only what is missing; needs root (CI runs as root) or sudo.
set -euo pipefail
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need+=(prometheus)
# slurmctld/slurmd/munged live in /usr/sbin, which a non-root PATH may lack
[ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v sbatch >/dev/null 2>&1 || need+=(slurm-wlm)
[ -x /usr/sbin/munged ] || need+=(munge)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "tests need: ${need[*]} (Debian packages); install them as root" >&2; exit 1; }
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${need[@]}" >/dev/null
