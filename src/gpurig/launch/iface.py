"""Network interfaces a job may listen on: the one the user names (``--iface``), else loopback for one machine.

gpurig's own listening sockets (the torch rendezvous, the side channel of
:mod:`gpurig.comm.sidechannel`) bind to one address, never to all of them; the
engines are told the same interface (Gloo: ``GLOO_SOCKET_IFNAME``; Open MPI:
``btl_tcp_if_include`` and ``oob_tcp_if_include``).
"""

from __future__ import annotations

import ipaddress
import socket

import psutil

from gpurig.errors import UsageError

IFACE_VARIABLE = "GPURIG_IFACE"


def interface_address(name: str, said: str = "--iface") -> str:
    """The IPv4 address of interface ``name``; a one-line :class:`UsageError` (naming it as ``said``) if it has none.

    >>> interface_address("lo")
    '127.0.0.1'
    """
    addresses = psutil.net_if_addrs()
    if not name or name not in addresses:
        raise UsageError(f"{said} {name!r}: no such network interface here (have: {', '.join(sorted(addresses))})")
    for address in addresses[name]:
        if address.family == socket.AF_INET:
            return address.address
    raise UsageError(f"{said} {name!r} has no IPv4 address")


def local_addresses() -> set[str]:
    """Every IPv4 address of this machine's interfaces.

    >>> "127.0.0.1" in local_addresses()
    True
    """
    return {a.address for addresses in psutil.net_if_addrs().values() for a in addresses if a.family == socket.AF_INET}


def bind_address(host: str, iface: str | None = None) -> str:
    """The one address to listen on so that peers reach ``host``: ``iface``'s, or ``host``'s when it is this machine's.

    Falls back to all addresses (``0.0.0.0``) only when ``host`` names no
    address of this machine and no interface is named (a name that resolves
    differently here than on the peers).

    >>> bind_address("127.0.0.1"), bind_address("localhost")
    ('127.0.0.1', '127.0.0.1')
    """
    if iface:
        return interface_address(iface)
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET)}
    except OSError:
        return "0.0.0.0"
    here = sorted(resolved & local_addresses())
    return here[0] if here else "0.0.0.0"


def listener(address: str, port: int = 0) -> socket.socket:
    """A TCP socket listening on ``address:port`` only (port 0: any free one), for a TCPStore to serve on.

    >>> with listener("127.0.0.1") as s: s.getsockname()[0]
    '127.0.0.1'
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def confine(env: dict, engine: str, all_here: bool, iface: str | None, mpi_args: str) -> tuple[dict, str]:
    """The ranks' environment and mpirun arguments that keep the job's sockets on ``iface``, or on loopback.

    With ``iface``: Gloo, NCCL's sockets, Open MPI's TCP transport and its runtime,
    gpurig's side channel and the torch rendezvous (``MASTER_ADDR``) all use that interface; ``GPURIG_IFACE`` in
    ``env`` stands for ``iface`` when it is not given.
    Without it, a job whose ranks all run here keeps to loopback: Gloo on ``lo``,
    and Open MPI moves data through shared memory only (its TCP transport would
    listen on every interface). mpirun arguments the user gave about these win.

    >>> env, args = confine({}, "mpi", True, None, "")
    >>> args
    '--mca btl self,vader'
    >>> env, args = confine({"GPURIG_IFACE": "lo"}, "mpi", True, None, "")
    >>> env["MASTER_ADDR"], env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"], args
    ('127.0.0.1', 'lo', 'lo', '--mca btl self,vader')
    """
    env = dict(env)
    loopback = False
    said = "--iface"
    if iface is None:   # the variable is the flag's default: checked here, once, not by every rank
        iface, said = env.get(IFACE_VARIABLE) or None, IFACE_VARIABLE
    if iface is not None:
        address = interface_address(iface, said)
        # NCCL's own socket traffic (bootstrap, and data where there is no InfiniBand) too: the one users fight most
        env.update({IFACE_VARIABLE: iface, "GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface,
                    "MASTER_ADDR": address})
        loopback = ipaddress.ip_address(address).is_loopback
        if loopback and not all_here:
            raise UsageError(f"{said} {iface!r} is loopback: ranks on other hosts cannot reach this one through it")
        if engine == "mpi" and not loopback and "if_include" not in mpi_args and "if_exclude" not in mpi_args:
            mpi_args = f"{mpi_args} --mca btl_tcp_if_include {iface} --mca oob_tcp_if_include {iface}".strip()
    if (iface is None or loopback) and all_here:   # Open MPI's runtime refuses loopback as its only interface
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        if engine == "mpi" and "btl" not in mpi_args:
            # shared memory is "vader" in Open MPI 4 and "sm" in 5, which still takes "vader" as an alias (4's "sm"
            # is a stub that stops every rank, as Debian's 4.1.6 on a lent GPU machine showed)
            mpi_args = f"{mpi_args} --mca btl self,vader".strip()
    return env, mpi_args
