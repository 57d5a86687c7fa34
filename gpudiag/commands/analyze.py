"""``gpudiag analyze``: a verdict from PyTorch profiler traces."""

from __future__ import annotations

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the full Diagnosis as JSON.")
@click.option("--device", metavar="NAME",
              help="Device whose peaks to use (e.g. H100-SXM, A100-80GB); default: the name "
                   "recorded in the trace. Unknown names are an error.")
@click.option("--peak-tflops", type=float, metavar="X",
              help="Peak TFLOP/s of the device (with --peak-gbps), for devices not in the table.")
@click.option("--peak-gbps", type=float, metavar="Y", help="Peak memory bandwidth in GB/s.")
@click.option("--flops-per-step", type=float, metavar="N",
              help="Model FLOPs per step per rank, when shapes were not recorded (for MFU).")
@click.option("--ranks", metavar="LIST",
              help="Analyse these ranks only: e.g. 0,3,7 or 0-3,8 (ranks as the traces record "
                   "them). Job-level numbers then describe these ranks.")
@click.option("--steps", metavar="FIRST[-LAST]",
              help="Analyse these ProfilerStep numbers only, e.g. 5-8: every number (breakdown, "
                   "roofline, top kernels, collectives) then describes those steps.")
@click.option("--jobs", type=click.IntRange(1, 256), default=None,
              help="Worker processes, each reading one rank at a time (default: one per CPU "
                   "core). Peak memory is about jobs x the largest rank's columns; results do "
                   "not depend on it.")
@click.option("--quiet", "-q", is_flag=True,
              help="No progress bar (it is shown on a terminal for analyses over a second).")
def analyze(target: str, as_json: bool, device: str | None, peak_tflops: float | None,
            peak_gbps: float | None, flops_per_step: float | None, ranks: str | None,
            steps: str | None, jobs: int | None, quiet: bool) -> None:
    """Diagnose the PyTorch profiler (Kineto) traces in TARGET.

    TARGET is a trace file (.json or .json.gz), a folder with one trace per rank, or a
    gpudiag run directory. The verdict names what limits the job (compute-, memory-,
    communication-, input- or host-bound), the numbers that decided it, and what to do.

    \b
    Examples:
      gpudiag analyze ./log/resnet              # a tensorboard_trace_handler folder
      gpudiag analyze rank-0.json.gz --device H100-SXM
      gpudiag analyze ./traces --json | jq .verdict
      gpudiag analyze ./traces --ranks 0-3,7 --steps 10-12
    """
    from gpudiag.commands.quiet_blas import quiet_blas_threads

    with quiet_blas_threads():
        from gpudiag.analyzers.diagnose import DeviceChoice, diagnose
        from gpudiag.analyzers.rank_pool import parse_ranks, parse_steps
        from gpudiag.collectors.cpu_peak import cpu_peak, raise_floor, this_host
        from gpudiag.collectors.gemm_probe import autocast_ratios
        from gpudiag.reports.progress import for_stderr
        from gpudiag.reports.terminal import render_terminal

    if flops_per_step is not None and flops_per_step <= 0:
        raise click.BadParameter("must be positive", param_hint="--flops-per-step")
    choice = DeviceChoice(name=device, peak_tflops=peak_tflops, peak_gbps=peak_gbps,
                          cpu_peak=cpu_peak, peak_floor=raise_floor, host=this_host(),
                          gemm_probe=autocast_ratios)
    diagnosis = diagnose(target, choice, flops_per_step=flops_per_step, jobs=jobs,
                         ranks=parse_ranks(ranks) if ranks is not None else None,
                         steps=parse_steps(steps) if steps is not None else None,
                         progress=for_stderr(quiet))
    if as_json:
        click.echo(diagnosis.to_json())
    else:
        click.echo(render_terminal(diagnosis))
