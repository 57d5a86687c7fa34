"""Team quotas as an administrator writes them on the command line: ``--quota TEAM=N``.

Both runtimes that take quotas from their command line - the local daemon and the Slurm
controller - read them here, so the two spell and refuse a quota alike; the policy core sees
only the resulting mapping (``Policy``'s fair share, team queues and reclaim).
"""

from __future__ import annotations

from gpudiag.errors import BadInput


def parse_quotas(items: tuple[str, ...] | list[str]) -> dict[str, int]:
    """``("vision=4", "nlp=2")`` -> ``{"vision": 4, "nlp": 2}``; a malformed item is one line."""
    out: dict[str, int] = {}
    for item in items:
        team, _, n = item.partition("=")
        if not team or not n.isdigit() or int(n) < 1:
            raise BadInput(f"--quota {item!r}: use TEAM=N with N a positive number of GPUs")
        if team in out:
            raise BadInput(f"--quota {team}: given twice ({out[team]} and {n}); give each team once")
        out[team] = int(n)
    return out
