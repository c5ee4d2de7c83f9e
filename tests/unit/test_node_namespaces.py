"""The several-node fixture's checks that need no namespace: its profile names
its head and Redis, and a profile that does not is refused before anything starts."""

from __future__ import annotations

import os

import pytest

from cluster.config import load_config
from cluster.launch.node_namespaces import NamespaceCluster, NamespaceClusterError
from cluster.node_layout import DEFAULT_NODES

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def test_the_shipped_profile_joins_the_cluster_the_nodes_make() -> None:
    cluster = NamespaceCluster()
    profile = load_config("multinode-cpu.yaml")
    cluster.check_profile(profile)
    assert cluster.api_root(profile) == "http://10.77.0.2:8000"
    # Another database of the nodes' Redis is the same cluster (the benchmark's).
    other_database = profile.redis.model_copy(update={"url": "redis://10.77.0.9:6379/9"})
    cluster.check_profile(profile.model_copy(update={"redis": other_database}))


def test_a_profile_naming_another_cluster_is_refused() -> None:
    local = load_config()
    with pytest.raises(NamespaceClusterError, match=r"ray\.address 10\.77\.0\.2:6379"):
        NamespaceCluster().check_profile(local)


def test_a_cluster_has_one_head() -> None:
    workers = [node for node in DEFAULT_NODES if not node.head]
    with pytest.raises(NamespaceClusterError, match="exactly one node is the head"):
        NamespaceCluster(nodes=workers)
    with pytest.raises(NamespaceClusterError, match="exactly one node is the head"):
        NamespaceCluster(nodes=[*DEFAULT_NODES, DEFAULT_NODES[0]])
