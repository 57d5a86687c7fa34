"""gpudiag beside a Slurm cluster: read squeue and the agents' signals, run the policy core, and
apply small, logged, undoable changes with Slurm's own commands (Nice, requeue, PreemptMode).
Slurm keeps gang allocation, placement and tier preemption wherever gpudiag cannot judge or act.
docs/slurm.md says how; docs/layout.md lists the modules.
"""
