"""gpudiag beside a Slurm cluster: read squeue and the agents' signals, run the policy core, and
apply small, logged, undoable changes with Slurm's own commands (``scontrol update Nice=``,
``scontrol requeue``, ``scontrol update PreemptMode=``). Slurm keeps doing gang allocation,
placement and tier preemption wherever gpudiag cannot judge or act.

Modules: ``squeue``/``slurmconf`` (parsing Slurm's output), ``slurmio`` (running Slurm's
commands), ``sources`` (signals from Prometheus' HTTP API or the agents' /metrics), ``adapter``
(Slurm jobs as the policy core's model), ``ledger`` (the write-ahead ledger and its lease),
``actions`` (changes made write-ahead, and their undo), ``fresh`` (Slurm read again just before
each PreemptMode or requeue write), ``arrays`` (array tasks and their array's Nice),
``takeover`` (which partitions gpudiag may hold without exposing another partition's jobs),
``serve_jobs`` (which waiting jobs gpudiag or Slurm serves), ``efficiency`` (Nice),
``history`` (MFU per key, kept across restarts), ``outages`` (signal sources out, named once),
``claim`` (one controller per cluster, whatever its ledger), ``qos`` (clusters that preempt by
QOS: Nice only, the top QOS tier exempt), ``says`` (how it steers, said once and truly),
``controller`` (one round; ``writes``: its changes written), ``loop`` (the processes:
rounds, ``--restore-only``, ``--watchdog``). docs/slurm.md says how to run them.
"""
