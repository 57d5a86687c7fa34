"""``gpudiag report``: a self-contained HTML report of a run directory or of traces.

A run directory already holds the ``diagnosis.json`` that ``gpudiag profile`` wrote, so the
report is made from it without re-reading the traces; only when it is missing, unreadable or
of an older schema version are the traces analysed again (an older one may still be readable,
but it lacks what later analyses add, such as the unprofiled estimate from the step timer).
"""

from __future__ import annotations

from pathlib import Path

import click

from gpudiag.diagnosis import DIAGNOSIS_SCHEMA_VERSION, Diagnosis
from gpudiag.errors import BadInput
from gpudiag.rundir import diagnosis_path, is_run_dir, report_path


def load_diagnosis(target: Path) -> Diagnosis:
    """The Diagnosis of a run directory (its diagnosis.json if usable) or of trace files."""
    if not target.exists():
        raise BadInput(f"{target}: no such file or directory")
    if is_run_dir(target):
        try:
            d = Diagnosis.from_json(diagnosis_path(target).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, BadInput):
            pass  # missing, torn or another version: analyse the traces again
        else:
            if d.schema_version == DIAGNOSIS_SCHEMA_VERSION:
                return d
    from gpudiag.analyzers.diagnose import DeviceChoice, diagnose
    from gpudiag.collectors.cpu_peak import cpu_peak, raise_floor, this_host
    from gpudiag.collectors.gemm_probe import autocast_ratios

    return diagnose(target, DeviceChoice(cpu_peak=cpu_peak, peak_floor=raise_floor, host=this_host(),
                          gemm_probe=autocast_ratios))


def write_html(path: Path, html: str) -> None:
    try:
        path.write_text(html, encoding="utf-8")
    except OSError as e:
        raise BadInput(f"cannot write {path}: {e.strerror or e}") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="HTML file to write (default: TARGET/report.html for a run directory, "
                   "./gpudiag-report.html otherwise).")
@click.option("--json", "as_json", is_flag=True, help="Print the Diagnosis as JSON instead.")
def report(target: Path, output: Path | None, as_json: bool) -> None:
    """Write a self-contained HTML report for TARGET and print its path.

    TARGET is a gpudiag run directory (its diagnosis.json is used when it is current), a
    folder of rank traces, or one trace file. The report is one file: inline CSS and SVG
    charts, no JavaScript, nothing loaded over the network; the full Diagnosis is embedded
    as JSON.

    \b
    Examples:
      gpudiag report runs/20250101-120000-train       # writes runs/.../report.html
      gpudiag report ./traces -o resnet.html
    """
    d = load_diagnosis(target)
    if as_json:
        click.echo(d.to_json())
        return
    from gpudiag.reports.html import render_report

    out = output or (report_path(target) if is_run_dir(target) else Path("gpudiag-report.html"))
    write_html(out, render_report(d))
    click.echo(str(out))
