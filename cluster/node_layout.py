"""Where each node of the cluster `toolserve nodes` runs on one machine lives:
its address on the private bridge, its ports and the resources it offers.
What the launcher starts and the node-loss run addresses."""

from __future__ import annotations

from dataclasses import dataclass, field

SUBNET = "10.77.0"
RAY_PORT = 6379
DASHBOARD_PORT = 8265
METRICS_PORT = 8080
"""Each node's metrics agent: what a PodMonitor scrapes on KubeRay."""
REDIS_HOST = 9
REDIS_PORT = 6379
MODEL_NODE_RESOURCE = "model_node"
"""The custom resource the nodes that host a main replica offer."""


def namespace(name: str) -> str:
    """The network namespace of a node (or of Redis's host): where its processes run,
    e.g. `ip netns exec tsn-model-a ...`."""
    return f"tsn-{name}"


@dataclass(frozen=True)
class NodeSpec:
    """One Ray node: its name (the namespace's suffix), host number on the
    bridge's subnet, logical CPUs and the custom resources it offers."""

    name: str
    host: int
    num_cpus: int
    resources: dict[str, float] = field(default_factory=dict)
    head: bool = False

    @property
    def address(self) -> str:
        return f"{SUBNET}.{self.host}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.address}:{METRICS_PORT}/metrics"

    @property
    def namespace(self) -> str:
        return namespace(self.name)


# What KubeRay would run: a head (Serve's controller, proxy and the ingress),
# two model nodes (a main replica each) and a node for the tool workers.
DEFAULT_NODES: tuple[NodeSpec, ...] = (
    NodeSpec("head", 2, num_cpus=2, resources={"ingress_node": 1}, head=True),
    NodeSpec("model-a", 3, num_cpus=2, resources={MODEL_NODE_RESOURCE: 1}),
    NodeSpec("model-b", 4, num_cpus=2, resources={MODEL_NODE_RESOURCE: 1}),
    NodeSpec("tools", 5, num_cpus=2, resources={"tool_node": 1}),
)


def head_node(nodes: tuple[NodeSpec, ...] = DEFAULT_NODES) -> NodeSpec:
    return next(node for node in nodes if node.head)


def model_nodes(nodes: tuple[NodeSpec, ...] = DEFAULT_NODES) -> tuple[NodeSpec, ...]:
    """The nodes that host the main replicas, in order."""
    return tuple(node for node in nodes if MODEL_NODE_RESOURCE in node.resources)
