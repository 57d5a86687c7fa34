"""Trace replay: the policy core driven by simulated time (``gpudiag sim``, the replay benchmark).

Simulation-only code lives here, beside ``local/`` and ``slurm/``, so ``gpudiag.scheduler``
reads as the policy core the three runtimes share. Modules: ``traces`` (Philly, Tiresias and
sacct readers), ``mfu_model`` (the synthetic MFU and label of a trace's jobs), ``slowdown``
(what spreading costs a job), ``simulator`` (FIFO, EASY and gpudiag replays), ``tiresias``
(the 2D-LAS baseline), ``metrics`` (what a replay is judged by), ``fairness`` (finish-time
fairness, quota attainment), ``sweep`` and ``sweep_table`` (``gpudiag sim --sweep``: every policy
across loads and seeds, the ablation, the rows of its page).
"""
