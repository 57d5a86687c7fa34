"""Phases of a job that applies a fix part of the time, for "predicted vs applied".

``--phases b40,a20,b20,a20`` runs 40 steps as the job is (b), 20 with the fix (a), and so on,
then repeats the list until ``--steps``. Before and after alternate inside one process, so the
load other work puts on a shared machine hits both alike; gpudiag traces a window inside a long
"b" phase, and the job's own timer gives the "a" steps' time. The report lists each step's phase.
"""


def schedule(phases: str, steps: int) -> list[str]:
    """One "b" or "a" per step."""
    parts = [(p[0], int(p[1:])) for p in phases.split(",") if p]
    if not parts or any(k not in "ab" or n <= 0 for k, n in parts):
        raise SystemExit(f"--phases {phases!r}: expected a list like b40,a20")
    out: list[str] = []
    while len(out) < steps:
        for kind, n in parts:
            out.extend([kind] * n)
    return out[:steps]
