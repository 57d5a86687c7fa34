from gpudiag.cli import run

run()
