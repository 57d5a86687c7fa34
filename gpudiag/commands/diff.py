"""``gpudiag diff``: what changed between two runs, as one HTML page (or JSON)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("gpudiag-diff.html"),
              show_default=True, help="HTML file to write.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON instead.")
def diff(before: Path, after: Path, output: Path, as_json: bool) -> None:
    """Compare two runs: step time and its breakdown, label, MFU, kernels and operators.

    BEFORE and AFTER are each a gpudiag run directory, a folder of rank traces or a trace
    file. For two run directories the step time comes from the jobs' own step timers
    (untraced steps), with whether the change is larger than run-to-run noise, and labels and
    MFU from the unprofiled estimates; with traces on either side the profiler's slowdown can
    pass for a change, and the comparison says it cannot tell. Kernels and operators are
    compared by mean time per traced step, so runs that traced different numbers of steps
    still compare like for like.

    \b
    Examples:
      gpudiag diff runs/baseline runs/fused-adam           # prints the verdict, writes ./gpudiag-diff.html
      gpudiag diff old_traces/ new_traces/ --json | jq .step_time_change
    """
    from gpudiag.analyzers.compare import compare
    from gpudiag.commands.report import load_diagnosis, write_html

    b, a = load_diagnosis(before), load_diagnosis(after)
    result = compare(b, a, _untraced(before), _untraced(after))
    if as_json:
        click.echo(result.to_json())
        return
    from gpudiag.reports.html import render_diff
    from gpudiag.reports.terminal import render_diff_terminal

    write_html(output, render_diff(result, b, a))
    click.echo(render_diff_terminal(result))
    click.echo(f"Report: {output}")


def _untraced(target: Path) -> list[float] | None:
    """Untraced step times (seconds) of rank 0 from a run directory's step timer; None otherwise.

    One rank, not all pooled: the ranks of a synchronous job step together, so pooling would
    count each step several times and make the interval look tighter than the run is steady."""
    from gpudiag.rundir import is_run_dir, step_times

    if not is_run_dir(target):
        return None
    st = step_times(target, rank=0)
    return st.untraced if st is not None else None
