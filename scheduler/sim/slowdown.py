"""How much slower a job runs when its GPUs are spread further than they need to be (simulation only).

Only communication-heavy models are placement-sensitive (Tiresias, NSDI'19, section 2.3), as a
per-label ``SENSITIVITY``: duration x (1 + sensitivity x (``EXTRA_NODE_STEP`` if more nodes than
needed + ``EXTRA_RACK_STEP`` if more racks)). The numbers are ours: docs/scheduler-modelling.md.
"""

from __future__ import annotations

from gpudiag.scheduler.placement import nodes_needed

SENSITIVITY = {
    "communication-bound": 1.0,
    "compute-bound": 0.1,
    "memory-bound": 0.1,
    "input-bound": 0.02,
    "host-bound": 0.02,
    "unknown": 0.1,
}
EXTRA_NODE_STEP = 0.5   # leaving NVLink for the network inside a rack
EXTRA_RACK_STEP = 0.5   # and crossing the rack's switch on top of that


def slowdown(label: str, gpus: int, nodes: list[int], rack_of: list[int], per_node: int,
             rack_size: int) -> float:
    """The factor a job's run time grows by on ``nodes`` against the tightest placement."""
    min_nodes = nodes_needed(gpus, per_node)
    min_racks = nodes_needed(min_nodes, rack_size)
    extra = 0.0
    if len(nodes) > min_nodes:
        extra += EXTRA_NODE_STEP
    if len({rack_of[n] for n in nodes}) > min_racks:
        extra += EXTRA_RACK_STEP
    return 1.0 + SENSITIVITY.get(label, SENSITIVITY["unknown"]) * extra
