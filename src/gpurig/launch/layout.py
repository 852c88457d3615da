"""Which ranks one ``gpurig run`` starts, from any launcher's way of saying it.

gpurig's own ``-n`` and ``--hosts``, Horovod's ``-np``, ``-H`` and ``--hostfile``
(``host slots=N`` lines) and torchrun's ``--nproc-per-node``, ``--nnodes``,
``--node-rank``, ``--master-addr`` and ``--master-port`` all end as one
:class:`Layout`. Under ``--engine mpi`` one mpirun starts every host's ranks;
under ``--engine torch`` a launcher per node starts that node's ranks, as
torchrun's static rendezvous does (``--nnodes 2 --node-rank 0 ...`` on the first
machine, ``--node-rank 1`` on the second, the same ``--master-addr`` on both).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpurig.errors import UsageError
from gpurig.launch.hosts import check_hosts, parse_hosts

DEFAULT_MASTER_PORT = 29500  # torchrun's
_HOSTFILE_LINE = re.compile(r"([A-Za-z0-9_.\-]+)(?:\s+slots\s*=\s*(\S+))?")


def read_hostfile(path: str) -> str:
    """A Horovod / Open MPI hostfile (``host slots=N`` a line, ``#`` comments) as ``--hosts`` text.

    >>> import tempfile; f = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
    >>> _ = f.write("# two machines\\nnode1 slots=4\\nnode2   slots=2\\nnode3\\n"); f.close()
    >>> read_hostfile(f.name)
    'node1:4,node2:2,node3:1'
    """
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"--hostfile {path}: cannot read it ({getattr(error, 'strerror', None) or error})") from None
    hosts = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = _HOSTFILE_LINE.fullmatch(line)
        slots = match and (match.group(2) or "1")
        if not match or not slots.isdigit() or int(slots) < 1:
            raise UsageError(f"--hostfile {path} line {number}: {line!r} is not 'HOST' or 'HOST slots=N' with N a "
                             "positive integer")
        hosts.append(f"{match.group(1)}:{int(slots)}")
    if not hosts:
        raise UsageError(f"--hostfile {path} names no host")
    parse_hosts(",".join(hosts))  # a host named twice
    return ",".join(hosts)


@dataclass(frozen=True)
class Layout:
    """The ranks one launcher starts: ``nprocs`` of them, on ``hosts`` (empty: here), as node ``node_rank`` of
    ``nnodes`` (torch engine; each node's launcher starts its own ``nprocs``).

    >>> Layout(4, nnodes=2, node_rank=1).world_size, Layout(4, nnodes=2, node_rank=1).first_rank
    (8, 4)
    """

    nprocs: int
    hosts: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def world_size(self) -> int:
        """Ranks over all nodes."""
        return self.nprocs * self.nnodes

    @property
    def first_rank(self) -> int:
        """The global rank of this launcher's first rank."""
        return self.node_rank * self.nprocs


def _positive(value: int | None, flag: str, least: int = 1) -> None:
    if value is not None and value < least:
        raise UsageError(f"{flag} must be at least {least}, got {value}")


def layout_from_flags(engine: str, nprocs: int | None = None, hosts: str | None = None, hostfile: str | None = None,
                      nproc_per_node: int | None = None, nnodes: int | None = None, node_rank: int | None = None,
                      master_addr: str | None = None, master_port: int | None = None,
                      default_nprocs=lambda hosts: 2) -> Layout:
    """The :class:`Layout` the flags of ``gpurig run`` ask for; one :class:`UsageError` line for what disagrees.

    >>> layout_from_flags("mpi", hosts="a,b", nproc_per_node=4).hosts
    'a:4,b:4'
    >>> layout_from_flags("torch", nproc_per_node=2, nnodes=2, node_rank=1, master_addr="a").first_rank
    2
    >>> layout_from_flags("mpi", nprocs=3, nproc_per_node=2)
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: -n 3 disagrees with --nproc-per-node 2 x --nnodes 1 = 2 ranks: give one or the other
    """
    _positive(nprocs, "-n")
    _positive(nproc_per_node, "--nproc-per-node")
    _positive(nnodes, "--nnodes")
    _positive(node_rank, "--node-rank", least=0)
    if master_port is not None and not 0 < master_port < 65536:
        raise UsageError(f"--master-port must be a TCP port from 1 to 65535, got {master_port}")
    check_hosts(hosts)
    if hosts and hostfile:
        raise UsageError("--hosts (-H) and --hostfile both name the machines: give one")
    if hostfile:
        hosts = read_hostfile(hostfile)
    nodes, rank = nnodes or 1, node_rank or 0
    if rank >= nodes:
        raise UsageError(f"--node-rank {rank} with --nnodes {nodes}: node ranks go from 0 to {nodes - 1}")
    if nproc_per_node is not None and nprocs is not None and nprocs != nproc_per_node * nodes:
        raise UsageError(f"-n {nprocs} disagrees with --nproc-per-node {nproc_per_node} x --nnodes {nodes} = "
                         f"{nproc_per_node * nodes} ranks: give one or the other")
    if engine == "mpi":
        if nodes > 1 or rank > 0:
            named = len(parse_hosts(hosts)) if hosts else 1
            if nodes != named or rank > 0:
                raise UsageError(f"--nnodes {nodes} --node-rank {rank}: under --engine mpi one gpurig run starts "
                                 "every node's ranks: name the machines with --hosts (-H) or --hostfile and run it "
                                 "once (or use --engine torch, one gpurig run per node)")
        if nproc_per_node is not None:
            host_list = parse_hosts(hosts) if hosts else []
            if host_list:
                hosts = ",".join(f"{name}:{nproc_per_node}" for name, _ in host_list)
            nprocs = nproc_per_node * max(1, len(host_list))
        count = nprocs if nprocs is not None else default_nprocs(hosts)
        return Layout(count, hosts, master_addr=master_addr, master_port=master_port)
    # torch: this launcher starts this node's ranks
    if nodes > 1 and hosts:
        raise UsageError("--nnodes with --hosts: under --engine torch each node runs its own gpurig run; "
                         "drop --hosts")
    if nodes > 1 and not master_addr:
        raise UsageError(f"--nnodes {nodes} needs --master-addr: the address of node 0, the same on every node")
    if nproc_per_node is not None:
        here = nproc_per_node
    elif nprocs is not None:
        if nprocs % nodes:
            raise UsageError(f"-n {nprocs} does not split evenly over --nnodes {nodes}: use --nproc-per-node")
        here = nprocs // nodes
    else:
        here = default_nprocs(hosts)
    port = master_port if master_port is not None else (DEFAULT_MASTER_PORT if nodes > 1 else None)
    return Layout(here, hosts, nodes, rank, master_addr, port)
