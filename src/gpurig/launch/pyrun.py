"""Run a Python program as one rank, so its failure is known the moment it happens.

``python -m gpurig.launch.pyrun (SCRIPT | -m MODULE | -c CODE | -) [ARG ...]``
runs the program as ``python`` would, and when it ends with an exception or a
non-zero ``sys.exit``:

- it leaves its status file *before* the interpreter tears down. Teardown closes
  the rank's sockets, its peers then fail with "connection closed", and only
  this early record shows which rank failed first;
- under MPI it makes the exit an MPI_Abort (as ``python -m mpi4py`` does), so the
  job ends instead of hanging in MPI_Finalize while the peers wait in a collective.

When it succeeds after using torch.distributed, the process ends without the
interpreter's final teardown, in which Gloo's threads can abort it (:func:`_succeed`).

The launcher runs a Python command under this module when the command's
interpreter is gpurig's own (:func:`gpurig.launch.processes.as_rank_program`);
other commands run as given.
"""

from __future__ import annotations

import atexit
import builtins
import ctypes
import gc
import io
import os
import runpy
import socket
import sys
import sysconfig
import threading
import types
from pathlib import Path

from gpurig.errors import CollectiveFailed, RankFailed, UsageError
from gpurig.launch.env import rank_from_env
from gpurig.launch.processes import say
from gpurig.launch.progress import ProgressWriter, last_collective
from gpurig.launch.standby import wait_if_parked
from gpurig.launch.status import STATUS_DIR_VARIABLE, ended_by, record_failure


def _run(argv: list[str]) -> None:
    """Run ``argv`` as ``python ARGV`` would, with ``__name__ == "__main__"``."""
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] in ("-c", "-"):
        code = argv[1] if argv[0] == "-c" else sys.stdin.read()
        sys.argv = ["-c", *argv[2:]] if argv[0] == "-c" else argv
        main = types.ModuleType("__main__")
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        exec(compile(code, "<string>" if argv[0] == "-c" else "<stdin>", "exec"), main.__dict__)
    else:
        sys.argv = argv
        sys.path[0] = str(Path(argv[0]).resolve().parent)
        runpy.run_path(argv[0], run_name="__main__")


def _whole_lines() -> None:
    """Unbuffered output (``PYTHONUNBUFFERED``, ``python -u``, as many containers set) writes ``print``'s text and
    its newline as two writes, between which another rank's line can land ("rank 0 …rank 1 …"): each stream
    becomes line-buffered instead, one write a line (a ``\\r`` flushes too, so progress bars still move)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(getattr(stream, "buffer", None), io.FileIO):   # buffered already, or replaced
            continue
        setattr(sys, name, io.TextIOWrapper(io.BufferedWriter(stream.buffer), encoding=stream.encoding,
                                            errors=stream.errors, line_buffering=True))


def _failed(status: int, secondary: bool = False, cause: str | None = None) -> None:
    # where in its collectives the program ended, as its wrapper would say had it been killed
    during = None if secondary else last_collective()
    record_failure(os.environ.get(STATUS_DIR_VARIABLE),
                   RankFailed(rank_from_env(), socket.gethostname(), status, cause=cause, secondary=secondary,
                              during=during))
    if "mpi4py.MPI" in sys.modules:
        from mpi4py.run import set_abort_status

        set_abort_status(status)


def _user_frames(traceback):
    """The traceback without this module's and runpy's frames, as ``python script.py`` would show it."""
    ours = (__file__, runpy.run_path.__code__.co_filename)
    while traceback is not None and traceback.tb_frame.f_code.co_filename in ours:
        traceback = traceback.tb_next
    return traceback


def _location(traceback) -> str:
    """`` (at FILE:LINE)`` of the innermost frame of the program's own code, or ``""``."""
    own = (str(Path(__file__).resolve().parents[1]), "site-packages", "<frozen", sysconfig.get_paths()["stdlib"])
    found = ""
    while traceback is not None:
        code = traceback.tb_frame.f_code
        if not any(part in code.co_filename for part in own):
            found = f" (at {Path(code.co_filename).name}:{traceback.tb_lineno})"
        traceback = traceback.tb_next
    return found


def main(argv: list[str]) -> None:
    """Run the program in ``argv``; on failure record it and, under MPI, abort the job.

    >>> main(["train.py", "--epochs", "3"])   # as: python -m gpurig.launch.pyrun train.py --epochs 3  # doctest: +SKIP
    """
    if not argv or (argv[0] in ("-m", "-c") and len(argv) < 2):
        print("usage: python -m gpurig.launch.pyrun (SCRIPT | -m MODULE | -c CODE | -) [ARG ...]", file=sys.stderr)
        sys.exit(2)
    wait_if_parked(argv)  # a standby rank of a job that may restart: warm, until the launcher needs it
    _whole_lines()
    try:
        _run(argv)
    except SystemExit as done:
        status = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
        if status:
            _failed(status)
            ended_by(done)   # the others say this rank exited with its code, not that it finished its program
            raise
    except KeyboardInterrupt as error:   # Ctrl-C reached every rank: the launcher says so once, no rank's traceback
        _failed(130)
        ended_by(error)
        sys.exit(130)
    except CollectiveFailed as error:  # most often the consequence of another rank's end: one line, no traceback
        _failed(1, secondary=True, cause=f"exited with code 1: {error}")
        _say_once(error)
        sys.exit(1)
    except UsageError as error:   # gpurig refused how it was called (a rendezvous nobody joined): one line, as the CLI
        _failed(2, cause=f"exited with code 2: {error}")
        _say_once(error)
        ended_by(error)   # the others say what this rank raised, not that it finished its program
        sys.exit(2)
    except BaseException as error:
        what = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        _failed(1, cause=f"raised {type(error).__name__}{': ' + what if what else ''}")
        error = error.with_traceback(_user_frames(error.__traceback__))
        sys.excepthook(type(error), error, error.__traceback__)
        ended_by(error)
        sys.exit(1)
    _succeed()


def _say_once(error: BaseException) -> None:
    """One line on stderr naming this rank, the error and where in the program it was raised."""
    line = f"gpurig: rank {rank_from_env()} on host {socket.gethostname()}: {error}{_location(error.__traceback__)}"
    say(line)
    ProgressWriter().reported(line)  # said: the wrapper need not say it again


def _succeed() -> None:
    """End a program that succeeded; after torch.distributed, without the interpreter's teardown.

    A Gloo worker thread that drops the last reference to a finished collective
    needs the GIL for the Python state the work kept; once the interpreter is
    finalizing, taking the GIL ends the thread through a C++ frame that may not
    be unwound, and the process aborts ("terminate called without an active
    exception", SIGABRT) after the program did all its work: 1 job in 8-24 of
    PyTorch's DDP tutorial script, under torchrun as under gpurig run (issue 29).
    So what the teardown does for the program is done here, while no thread can
    be refused the GIL: wait for its threads, run its ``atexit`` functions,
    collect its garbage (files it left open are flushed), finish MPI, flush the
    streams; then the process exits at once.
    """
    if "torch.distributed" not in sys.modules:
        return
    threading._shutdown()  # what the interpreter's exit does first: wait for the program's non-daemon threads
    atexit._run_exitfuncs()
    gc.collect()
    if "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    ctypes.CDLL(None).fflush(None)  # C libraries' stdio buffers
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
