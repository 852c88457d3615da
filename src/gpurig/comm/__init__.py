"""Communication: one Communicator API over real engines (MPI via mpi4py, torch.distributed).

:func:`init` also starts the failure watch (:mod:`gpurig.comm.watch`) over the
side channel (:mod:`gpurig.comm.sidechannel`) when the job has several ranks.

>>> import gpurig.comm
>>> comm = gpurig.comm.init()     # engine and rank from the launcher's environment
>>> comm.size >= 1
True
"""

from __future__ import annotations

import atexit

from gpurig.comm.communicator import Communicator, Handle, Prepared, split_sizes
from gpurig.comm.guard import CollectiveMismatchError
from gpurig.comm.signature import Signature
from gpurig.launch.env import detect_engine
from gpurig.launch.settings import Settings

ENGINES = ("mpi", "torch")
_current: Communicator | None = None


def init(engine: str | None = None, backend: str | None = None) -> Communicator:
    """Start (once) and return this process's Communicator.

    ``engine`` is ``"mpi"`` or ``"torch"``; by default it comes from
    ``GPURIG_ENGINE`` (set by ``gpurig run``) or from whichever launcher started
    the process. ``backend`` picks torch.distributed's backend (``gloo``/``nccl``).
    A second call returns the same Communicator. Every rank must call it
    (starting the watch exchanges the side channel's address).

    >>> comm = init()
    >>> comm is init()
    True
    """
    global _current
    if _current is not None:
        return _current
    settings = Settings.from_env()
    engine = engine or detect_engine()
    if engine == "mpi":
        from gpurig.comm.mpi_engine import MPIEngine

        _current = Communicator(MPIEngine(), check=settings.check)
    elif engine == "torch":
        from gpurig.comm.torch_engine import TorchEngine

        _current = Communicator(TorchEngine(backend=backend), check=settings.check)
    else:
        raise ValueError(f"unknown engine {engine!r}; choose one of {ENGINES}")
    if _current.size > 1 and (settings.failure_timeout > 0 or settings.stall_timeout > 0):
        _current.watch = _start_watch(_current, settings)
    atexit.unregister(_shutdown_at_exit)   # once, however often init runs
    atexit.register(_shutdown_at_exit)
    return _current


def _shutdown_at_exit() -> None:
    """:func:`shutdown` as the program ends. Ctrl-C again while it waits (for the other ranks to finish, say)
    ends it there: the launcher stops the job, and a traceback from inside gpurig would say nothing more."""
    try:
        shutdown()
    except KeyboardInterrupt:
        pass


def _start_watch(comm: Communicator, settings: Settings):
    from gpurig.comm.sidechannel import open_for_mpi
    from gpurig.comm.watch import Watch

    channel = comm.engine.side_channel if comm.engine.name == "torch" else open_for_mpi(comm.engine, 60.0)
    if channel is None:
        if comm.rank == 0:
            from gpurig.launch.processes import say

            say("gpurig: failure detection is off: rank 0 found no address for the side channel "
                "(name the network interface with --iface or GPURIG_IFACE)")
        return None
    watch = Watch(channel, comm.rank, comm.size, comm.guard, settings, comm.engine.abort)
    return watch if watch.start() else None


def current() -> Communicator:
    """The Communicator started by :func:`init` (starting it if needed).

    >>> current() is init()
    True
    """
    return _current if _current is not None else init()


def started() -> Communicator | None:
    """The Communicator :func:`init` started, or None before it; starts nothing.

    >>> started() is None or started() is current()
    True
    """
    return _current


def shutdown() -> None:
    """Finish pending collectives and release the engine; :func:`init` may be called again after."""
    global _current
    if _current is not None:
        comm, _current = _current, None
        comm.shutdown()


__all__ = ["Communicator", "Handle", "CollectiveMismatchError", "Signature", "init", "current", "shutdown",
           "split_sizes", "ENGINES"]
