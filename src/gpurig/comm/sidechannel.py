"""The side channel: a key-value store beside the engine for heartbeats and progress, never for tensors.

It is torch's ``TCPStore`` (what torch.distributed's own rendezvous uses),
served by rank 0 and bound to one address (:func:`gpurig.launch.iface.listener`):

- torch engine: the rendezvous store itself, at ``MASTER_ADDR:MASTER_PORT``
  (:func:`rendezvous_store`; under torchrun, its agent's store);
- MPI engine: a store rank 0 opens on a free port of the job's interface
  (``GPURIG_IFACE``, else ``GLOO_SOCKET_IFNAME``, else loopback when all ranks
  share one machine), whose address it broadcasts once (:func:`open_for_mpi`).

Its users open their own connection to it (:meth:`SideChannel.connect`), so a
blocked call never holds up the engine.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from gpurig.launch.env import restart_count
from gpurig.launch.iface import IFACE_VARIABLE, bind_address, interface_address, listener, local_addresses


@dataclass
class SideChannel:
    """Where the store is (``host:port``); on rank 0 also the serving store, kept alive here.

    >>> channel = SideChannel("127.0.0.1", 29500)
    >>> channel.endpoint
    '127.0.0.1:29500'
    """

    host: str
    port: int
    server: object = field(default=None, repr=False)
    prefix: str = ""  # under torchrun's agent store, which outlives an attempt: this attempt's keys only

    @property
    def endpoint(self) -> str:
        """``host:port``, for messages."""
        return f"{self.host}:{self.port}"

    def connect(self, timeout_s: float) -> "dist.TCPStore":
        """A new client connection; each operation on it gives up after ``timeout_s`` seconds.

        >>> store = channel.connect(30); store.set("beat/0", b"...")   # doctest: +SKIP
        """
        store = dist.TCPStore(self.host, self.port, is_master=False, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        return dist.PrefixStore(self.prefix, store) if self.prefix else store


def _serve(host: str, port: int, world_size: int, timeout_s: float) -> "dist.TCPStore":
    """A TCPStore server listening on ``host``'s address only (never on every interface, as TCPStore alone does)."""
    sock = listener(bind_address(host, os.environ.get(IFACE_VARIABLE)), port)
    port = sock.getsockname()[1]
    fd = sock.detach()  # the store owns the listening socket from here on
    try:
        return dist.TCPStore(host, port, world_size, True, timeout=datetime.timedelta(seconds=timeout_s),
                             wait_for_workers=False, master_listen_fd=fd)
    except BaseException:
        os.close(fd)
        raise


def rendezvous_store(rank: int, size: int, timeout_s: float, env=None) -> tuple["dist.TCPStore", SideChannel]:
    """The torch engine's rendezvous store at ``MASTER_ADDR:MASTER_PORT``: served by rank 0, bound to that address.

    Under torchrun (``TORCHELASTIC_USE_AGENT_STORE``) the agent serves it and every rank is a client; the agent's
    store lives on when torchrun restarts the job (``--max-restarts``), so each attempt keeps to keys of its own
    (without, the restarted ranks read the last attempt's Gloo addresses and wait for dead peers).

    >>> store, channel = rendezvous_store(0, 1, 30, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"})   # doctest: +SKIP
    """
    env = os.environ if env is None else env
    host, port = env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", "29500"))
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0 and env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        store = _serve(host, port, size, timeout_s)
        return store, SideChannel(host, store.port, store)
    store = dist.TCPStore(host, port, size, False, timeout=timeout, wait_for_workers=False)
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        prefix = f"gpurig/attempt_{restart_count(env)}/"
        return dist.PrefixStore(prefix, store), SideChannel(host, port, prefix=prefix)
    return store, SideChannel(host, port)


def mpi_channel_host(single_host: bool, env=None) -> str | None:
    """The address rank 0 serves the MPI job's side channel on, or None when it cannot tell one.

    >>> mpi_channel_host(True, {})
    '127.0.0.1'
    """
    env = os.environ if env is None else env
    iface = env.get(IFACE_VARIABLE) or env.get("GLOO_SOCKET_IFNAME")
    if iface:
        return interface_address(iface)
    if single_host:
        return "127.0.0.1"
    try:
        named = socket.gethostbyname(socket.gethostname())
    except OSError:
        named = None
    if named in local_addresses() and not ipaddress.ip_address(named).is_loopback:
        return named
    return next((a for a in sorted(local_addresses()) if not ipaddress.ip_address(a).is_loopback), None)


def open_for_mpi(engine, timeout_s: float) -> SideChannel | None:
    """Rank 0 serves a store and broadcasts its address over MPI (one small broadcast); None if it could not.

    Every rank of the engine must call it.

    >>> channel = open_for_mpi(MPIEngine(), 30)   # doctest: +SKIP
    """
    server, endpoint = None, torch.zeros(5, dtype=torch.int64)
    if engine.rank == 0:
        try:
            host = mpi_channel_host(engine.local_size == engine.size)
            if host is not None:
                server = _serve(host, 0, engine.size, timeout_s)
                endpoint = torch.tensor([*map(int, host.split(".")), server.port], dtype=torch.int64)
        except Exception:  # no address to serve on: the job runs without the watch, and says so
            server = None
    engine.broadcast(endpoint, 0)
    if int(endpoint[4]) == 0:
        return None
    return SideChannel(".".join(str(int(octet)) for octet in endpoint[:4]), int(endpoint[4]), server)
