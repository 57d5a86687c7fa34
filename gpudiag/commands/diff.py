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
    (untraced steps), with whether the change is larger than run-to-run noise, judged at each
    job's own pace (every step less the wait for a core other processes caused, so a busier
    machine is not read as a slower job; the wall clock is shown beside it where the two
    disagree), and labels and MFU from the unprofiled estimates; with traces on either side
    the profiler's slowdown can pass for a change, and the comparison says it cannot tell.
    Kernels and operators are compared by mean time per traced step, so runs that traced
    different numbers of steps still compare like for like.

    \b
    Examples:
      gpudiag diff runs/baseline runs/fused-adam           # prints the verdict, writes ./gpudiag-diff.html
      gpudiag diff runs/baseline runs/fused-adam --json | jq .own_pace_change
      gpudiag diff old_traces/ new_traces/                 # traces only: no judgement, says why

    \b
    JSON: step_time_change is the headline change (after/before - 1: the own pace's where both
    runs recorded it, else the wall clock's, else the traced steps'); own_pace_change and
    step_change are the two judgements in full (median step before and after, the 95% interval,
    the noise floor, significant, direction); step_time_verdict is the sentence printed.
    """
    from gpudiag.analyzers.compare import compare
    from gpudiag.commands.report import load_diagnosis, write_html

    b, a = load_diagnosis(before), load_diagnosis(after)
    from gpudiag.analyzers.diagnose import diagnosis_device_busy_s

    (bw, bo, br), (aw, ao, ar) = (_untraced(before, diagnosis_device_busy_s(b)),
                                  _untraced(after, diagnosis_device_busy_s(a)))
    result = compare(b, a, bw, aw, before_own=bo, after_own=ao, before_run=br, after_run=ar)
    if as_json:
        click.echo(result.to_json())
        return
    from gpudiag.reports.html import render_diff
    from gpudiag.reports.terminal import render_diff_terminal

    write_html(output, render_diff(result, b, a))
    click.echo(render_diff_terminal(result))
    click.echo(f"Report: {output}")


def _untraced(target: Path, device_s: dict[int, float] | None = None,
              ) -> tuple[list[float] | None, list[float] | None, list[float] | None]:
    """Untraced step times (seconds) of rank 0 from a run directory's step timer, by wall clock
    and at the job's own pace (``gpudiag.pace``: None where the run recorded no split), and the
    training thread's time on a core in those steps (None where not recorded); (None, None,
    None) for traces.

    One rank, not all pooled: the ranks of a synchronous job step together, so pooling would
    count each step several times and make the interval look tighter than the run is steady.
    Every rank is read for the own pace, which excuses rank 0 a crowded peer's part."""
    from dataclasses import replace

    from gpudiag.pace import at_own_pace, recorded
    from gpudiag.rundir import is_run_dir, read_bootstrap, read_host_cpu, read_steps
    from gpudiag.steps import split_step_rows

    if not is_run_dir(target):
        return None, None, None
    boot = read_bootstrap(target)
    rows = read_steps(target, boot)  # every rank: a crowded peer holds rank 0 in collectives
    if 0 not in rows:
        return None, None, None
    wall = split_step_rows(0, rows[0], meta=boot.get(0)).untraced
    if not recorded(rows):
        return wall, None, None
    own = at_own_pace(rows, read_host_cpu(target), boot, device_s)[0]
    ran = [replace(r, dt=r.run_s) for r in own if r.run_s is not None]
    return (wall, split_step_rows(0, own, meta=boot.get(0)).untraced,
            split_step_rows(0, ran, meta=boot.get(0)).untraced or None)
