"""How much slower a job runs when its GPUs are spread further than they need to be (simulation only).

Shape: Tiresias (Gu et al., NSDI'19, section 2.3 "placement sensitivity") measured that only
some models slow down markedly when their GPUs span machines - those whose step is dominated by
exchanging large tensors (VGG, AlexNet: up to about 2x), while others (ResNet, Inception)
barely notice. We carry that as a per-label sensitivity: the work of a communication-bound job
crosses the slow link, the others' mostly does not. The numbers are ours, not fitted:

    duration factor = 1 + SENSITIVITY[label] * (EXTRA_NODE_STEP * [more nodes than needed]
                                                + EXTRA_RACK_STEP * [more racks than needed])

so a communication-bound job spread over racks runs 2x as long (Tiresias' worst case), one
spread over nodes inside a rack 1.5x; a compute-bound job 1.05x and 1.1x.
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
