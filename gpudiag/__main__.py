"""`python -m gpudiag`: the same command line as the `gpudiag` script."""

from gpudiag.cli import run

run()
