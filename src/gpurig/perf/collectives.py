"""What a collective costs on a cluster: alpha-beta (Hockney) time per link tier.

A cluster for communication is ``nodes`` machines of ``gpus_per_node`` GPUs:
GPUs of one node talk over a *local* link (PCIe, NVLink, shared memory), nodes
over the *network* (one NIC per node, shared by the node's GPUs). A link is a
latency ``alpha`` and a rate (``beta`` = 1 / rate): sending n bytes takes
alpha + n·beta. Without GPUDirect RDMA a transfer between nodes also crosses
PCIe twice (GPU → host → NIC … NIC → host → GPU): the host copies are added to
the network's beta (not pipelined — what MPI without RDMA did in the source's
time; NCCL's pipelined staging does better, so this is an upper bound).

Algorithms for an allreduce of n bytes over P = nodes × gpus_per_node ranks:

- ``ring``: 2(P−1) steps of n/P bytes on every link of the ring; the ring
  crosses each NIC once in each direction, so the slowest link sets the pace.
- ``tree``: a pipelined reduce then broadcast down a binary tree: 2·log2(P)
  latencies, about 2n bytes through the busiest link.
- ``hierarchical``: reduce-scatter inside each node, a ring allreduce of the
  node's shards between nodes (all GPUs of a node at once, sharing the NIC),
  allgather inside the node.
- ``naive``: every GPU sends its whole gradient to every other GPU (the
  source's 2014 scheme): the traffic grows with P.

>>> topo = Topology(nodes=2, gpus_per_node=1, local=Link(0, 10e9), network=Link(0, 125e6))
>>> round(allreduce_seconds(9.6e6, topo, "ring") * 1000, 1)   # the MNIST MLP over 1 Gbit/s
76.8
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALGORITHMS = ("ring", "tree", "hierarchical", "naive")


@dataclass(frozen=True)
class Link:
    """A link: ``latency_s`` per message and ``bytes_per_s`` each way.

    >>> Link(1e-6, 1e9).seconds(1e6)
    0.001001
    """

    latency_s: float
    bytes_per_s: float

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bytes_per_s

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 1.0 / self.bytes_per_s


@dataclass(frozen=True)
class Topology:
    """Ranks as the cost model sees them.

    ``nic_shared``: the GPUs of a node share one NIC, so their transfers
    through it take turns (the source's "only one GPU can transfer data through
    the network card at any one time"). ``staging``: the host copy each side of
    a network transfer adds without GPUDirect RDMA (None: GPUDirect, or CPU ranks).
    """

    nodes: int
    gpus_per_node: int
    local: Link
    network: Link
    nic_shared: bool = True
    staging: Link | None = None

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def inter_node(self) -> Link:
        """The network link as a transfer between GPUs of two nodes sees it (host copies added when staged)."""
        if self.staging is None:
            return self.network
        beta = self.network.beta + 2 * self.staging.beta
        return Link(self.network.latency_s + 2 * self.staging.latency_s, 1.0 / beta)

    def slowest(self) -> Link:
        """The link that bounds a collective over every rank: the network if there are several nodes."""
        return self.inter_node if self.nodes > 1 else self.local


def ring_seconds(nbytes: float, ranks: int, link: Link, phases: int = 2) -> float:
    """A ring reduce-scatter (phases=1), allgather (1) or allreduce (2) of ``nbytes`` over ``ranks`` on ``link``.

    >>> round(ring_seconds(4e6, 4, Link(0, 1e9)) * 1000, 3)        # 2·(3/4)·4 MB at 1 GB/s
    6.0
    """
    if ranks <= 1:
        return 0.0
    steps = phases * (ranks - 1)
    return steps * link.latency_s + steps * (nbytes / ranks) * link.beta


def allreduce_seconds(nbytes: float, topology: Topology, algorithm: str = "ring") -> float:
    """Seconds to allreduce ``nbytes`` on every rank of ``topology`` with ``algorithm``.

    >>> t = Topology(2, 4, local=Link(0, 10e9), network=Link(0, 1e9))
    >>> [round(allreduce_seconds(8e6, t, a) * 1000, 2) for a in ("ring", "hierarchical")]
    [14.0, 9.2]
    """
    P = topology.ranks
    if P <= 1 or nbytes <= 0:
        return 0.0
    if algorithm == "ring":
        return ring_seconds(nbytes, P, topology.slowest())
    if algorithm == "tree":
        link = topology.slowest()
        return 2 * math.ceil(math.log2(P)) * link.latency_s + 2 * nbytes * link.beta
    if algorithm == "hierarchical":
        G, M = topology.gpus_per_node, topology.nodes
        inside = ring_seconds(nbytes, G, topology.local, phases=1)
        # Every GPU of a node allreduces its 1/G shard between nodes at once: the NIC carries all G shards.
        between = ring_seconds(nbytes, M, topology.inter_node) if M > 1 else 0.0
        return 2 * inside + between
    if algorithm == "naive":
        return naive_exchange_seconds(nbytes, topology)
    raise ValueError(f"unknown allreduce algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")


def naive_exchange_seconds(nbytes: float, topology: Topology) -> float:
    """Every GPU sends its whole ``nbytes`` gradient to every other GPU (the source's 2014 scheme).

    Local peers go over the local link while remote peers go through the NIC
    (the two overlap, so the slower decides); with a shared NIC the node's
    GPUs take turns. The source's example: 6 GPUs in 2 nodes, 4 MB at 0.75 ms
    per transfer over 40 Gbit/s → 3 remote peers → 2.25 ms, ×3 GPUs sharing
    the NIC → 6.75 ms (the post misprints 7.75); 4 nodes × 3 GPUs → 20.25 ms.

    >>> nic = Link(0, 4e6 / 0.75e-3)          # a 4 MB transfer takes 0.75 ms
    >>> pcie = Link(0, 4e6 / 0.25e-3)
    >>> [round(naive_exchange_seconds(4e6, Topology(m, 3, pcie, nic, nic_shared=s)) * 1000, 2)
    ...  for m, s in ((2, False), (2, True), (4, True))]
    [2.25, 6.75, 20.25]
    """
    G, M = topology.gpus_per_node, topology.nodes
    local = (G - 1) * topology.local.seconds(nbytes)
    remote_peers = (M - 1) * G
    remote = remote_peers * topology.inter_node.seconds(nbytes) * (G if topology.nic_shared else 1)
    return max(local, remote)


def best_allreduce(nbytes: float, topology: Topology, algorithms=ALGORITHMS[:3]) -> tuple[str, float]:
    """The fastest algorithm for this size and topology, and its time (what NCCL's tuner picks among).

    >>> best_allreduce(1e3, Topology(8, 1, Link(1e-6, 1e10), Link(5e-6, 1e10)))[0]
    'tree'
    """
    times = {a: allreduce_seconds(nbytes, topology, a) for a in algorithms}
    best = min(times, key=times.get)
    return best, times[best]


def syncs_per_second(nbytes: float, bytes_per_s: float, transfers: int = 1) -> float:
    """How many gradients of ``nbytes`` a link can synchronize per second when each needs ``transfers`` sends.

    The source's MNIST-over-Ethernet reply: 1 Gbit/s shared by 4 GPUs is 31 MB/s
    each; a 1200×1200 fp32 matrix is 5.76 MB, so 5.4 syncs/s — against 150
    batches/s on one GPU, about 28x slower (the post rounds to 6 and 25x).

    >>> round(syncs_per_second(1200 * 1200 * 4, 125e6 / 4), 2)
    5.43
    """
    return bytes_per_s / (nbytes * transfers)
