"""The gang scheduler: a pure policy core and its runtimes (simulator, local daemon, Slurm)."""
