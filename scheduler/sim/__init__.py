"""Trace replay: the policy core driven by simulated time (``gpudiag sim``, the replay benchmark).

Simulation-only code lives here, beside ``local/`` and ``slurm/``; docs/layout.md lists the modules.
"""
