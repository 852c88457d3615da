"""Whether MPI is here, which one, and whether it is CUDA-aware — asked in a child process.

``from mpi4py import MPI`` initialises MPI, which a probe must not do to its
own process (a later ``gpurig.init()`` would find it started). The child
imports mpi4py with initialisation switched off, reads the library version and
calls ``MPIX_Query_cuda_support`` (through :func:`gpurig.comm.mpi_engine.mpi_is_cuda_aware`);
``ompi_info`` adds whether Open MPI was built with CUDA support.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

_CHILD = """
import json, mpi4py
mpi4py.rc.initialize = False
mpi4py.rc.finalize = False
from mpi4py import MPI
from gpurig.comm.mpi_engine import mpi_is_cuda_aware
print(json.dumps({"library": MPI.Get_library_version().strip("\\x00 \\n").split(",")[0],
                  "mpi4py": mpi4py.__version__, "cuda_aware": mpi_is_cuda_aware()}))
"""


def ompi_built_with_cuda() -> bool | None:
    """Open MPI's ``opal_built_with_cuda_support`` from ompi_info (None when there is no ompi_info)."""
    ompi_info = shutil.which("ompi_info", path=str(Path(sys.executable).parent)) or shutil.which("ompi_info")
    if ompi_info is None:
        return None
    try:
        out = subprocess.run([ompi_info, "--parsable", "--all"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        if "opal_built_with_cuda_support:value:" in line:
            return line.rsplit(":", 1)[1].strip() == "true"
    return None


def mpi() -> dict:
    """``{"present", "library", "mpi4py", "cuda_aware", "built_with_cuda", "error"}`` for this environment.

    >>> info = mpi(); isinstance(info["present"], bool)
    True
    """
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"present": False, "error": str(error)}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["mpi4py could not load an MPI library"])[-1]
        return {"present": False, "error": last}
    info = json.loads(done.stdout.strip().splitlines()[-1])
    return {"present": True, **info, "built_with_cuda": ompi_built_with_cuda()}
