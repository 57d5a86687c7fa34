"""What the Slurm tests on the session's default cluster share: the cluster reset for the module,
a real agent beside it (``backend="none"``: no GPU counters, job signals only), and, after each
test, what a failed test may have left tidied away.

A test module takes them by name: ``from tests.slurm_fixtures import agent, cluster, tidy``
(``tidy`` is autouse: imported, it runs after each of the module's tests). A module with a
cluster of its own (other nodes, another SlurmUser or preempt type) defines its own ``cluster``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurm_cluster import TIERS, SlurmCluster
from tests.system.agent.test_agent import Agent

# the partitions a controller holds at PreemptMode=OFF while it works (every tier but the top)
PREEMPTIBLE = tuple(p for p, rank in TIERS.items() if rank < max(TIERS.values()))


@pytest.fixture(scope="module")
def cluster(slurm_cluster: SlurmCluster) -> SlurmCluster:
    """The session's default cluster (conftest.slurm_cluster), reset for this module."""
    slurm_cluster.reset()
    return slurm_cluster


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    with Agent(tmp_path_factory.mktemp("agent"), backend="none") as a:
        yield a


@pytest.fixture(autouse=True)
def tidy(cluster: SlurmCluster) -> Iterator[None]:
    """After each test: no job left, no controller's claim or reload mark, and the preemptible
    partitions back at PreemptMode=REQUEUE (a test that failed holding them leaves them OFF)."""
    yield
    cluster.cancel_all()
    cluster.forget_controllers()
    for p in PREEMPTIBLE:
        cluster.run("scontrol", "update", f"PartitionName={p}", "PreemptMode=REQUEUE", check=False)
