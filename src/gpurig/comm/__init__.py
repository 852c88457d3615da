"""Communication: one Communicator API over real engines (MPI via mpi4py, torch.distributed).

>>> import gpurig.comm
>>> comm = gpurig.comm.init()     # engine and rank from the launcher's environment
>>> comm.size >= 1
True
"""

from __future__ import annotations

import atexit

from gpurig.comm.communicator import Communicator, Handle, split_sizes
from gpurig.launch.env import detect_engine

ENGINES = ("mpi", "torch")
_current: Communicator | None = None


def init(engine: str | None = None, backend: str | None = None) -> Communicator:
    """Start (once) and return this process's Communicator.

    ``engine`` is ``"mpi"`` or ``"torch"``; by default it comes from
    ``GPURIG_ENGINE`` (set by ``gpurig run``) or from whichever launcher started
    the process. ``backend`` picks torch.distributed's backend (``gloo``/``nccl``).
    A second call returns the same Communicator.

    >>> comm = init()
    >>> comm is init()
    True
    """
    global _current
    if _current is not None:
        return _current
    engine = engine or detect_engine()
    if engine == "mpi":
        from gpurig.comm.mpi_engine import MPIEngine

        _current = Communicator(MPIEngine())
    elif engine == "torch":
        from gpurig.comm.torch_engine import TorchEngine

        _current = Communicator(TorchEngine(backend=backend))
    else:
        raise ValueError(f"unknown engine {engine!r}; choose one of {ENGINES}")
    atexit.register(shutdown)
    return _current


def current() -> Communicator:
    """The Communicator started by :func:`init` (starting it if needed).

    >>> current() is init()
    True
    """
    return _current if _current is not None else init()


def shutdown() -> None:
    """Finish pending collectives and release the engine; :func:`init` may be called again after."""
    global _current
    if _current is not None:
        comm, _current = _current, None
        comm.shutdown()


__all__ = ["Communicator", "Handle", "init", "current", "shutdown", "split_sizes", "ENGINES"]
