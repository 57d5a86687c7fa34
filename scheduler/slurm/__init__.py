"""gpudiag beside a Slurm cluster: read squeue and the agents' signals, run the policy core, and
apply small, logged, reversible changes with Slurm's own commands (``scontrol update Nice=``,
``scontrol requeue``). Slurm keeps doing gang allocation, placement and tier preemption.

Modules: ``squeue`` (parsing Slurm's output), ``slurmio`` (running Slurm's commands),
``sources`` (signals from Prometheus' HTTP API or the agents' /metrics), ``adapter`` (Slurm
jobs as the policy core's model), ``controller`` (one round, the ledger of changes, the loop).
"""
