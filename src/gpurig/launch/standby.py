"""Standby ranks: the next attempt of a job that may restart, started ahead and parked after their imports.

With ``--max-restarts``, while an attempt runs, ``gpurig run`` starts the ranks
of the next one as well (same command, the next attempt's environment, its
``GPURIG_PARKED`` naming a file that does not exist yet). Each runs under
:mod:`gpurig.launch.pyrun`, which imports torch and the modules the program
imports at its top level, the slow part of a Python rank's start (5-7 s on a
busy 2-core machine), and then waits for the file: when a rank
fails, the launcher creates it and the next attempt is running at once, instead
of starting from nothing as torchrun's restarted workers do. When the job ends
without needing them, they are stopped before the program began. A program
that knows its own slow start can park after it instead (:func:`park`):
``gpurig train`` waits with its data loaded.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
import time
from pathlib import Path

PARK_VARIABLE = "GPURIG_PARKED"
PARKS_ITSELF_VARIABLE = "GPURIG_PARKS_ITSELF"  # the program calls park() itself, after its own slow start
POLL_S = 0.005
WARM_MODULES = ("torch", "torch.distributed", "torch.nn.parallel")
COLD_MODULES = ("mpi4py",)  # importing mpi4py.MPI starts MPI: only once the rank runs


def program_imports(argv: list[str]) -> list[str]:
    """The modules a program (pyrun's ``SCRIPT`` or ``-m MODULE``) imports at its top level, in order.

    >>> import tempfile; f = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    >>> _ = f.write("import os, json\\nfrom torch import nn\\nfrom . import x\\ndef f():\\n    import numpy\\n"); f.close()
    >>> program_imports([f.name])
    ['os', 'json', 'torch']
    """
    if not argv or argv[0] in ("-c", "-"):
        return []
    try:
        if argv[0] == "-m":
            spec = importlib.util.find_spec(argv[1])
            if spec is not None and spec.submodule_search_locations:  # a package: its __main__
                spec = importlib.util.find_spec(f"{argv[1]}.__main__")
            path = spec.origin if spec is not None else None
        else:
            path = argv[0]
        tree = ast.parse(Path(path).read_text())
    except (ImportError, OSError, SyntaxError, TypeError, ValueError, IndexError):
        return []
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def wait_if_parked(argv: list[str] = (), env=None) -> bool:
    """In a standby rank: import torch and what the program ``argv`` imports first, then wait until the launcher
    releases it. False in a rank that is not parked.

    >>> wait_if_parked(["train.py"], {})
    False
    """
    env = os.environ if env is None else env
    go = env.get(PARK_VARIABLE)
    if not go or env.get(PARKS_ITSELF_VARIABLE):
        return False
    if argv and argv[0] not in ("-m", "-c", "-"):
        sys.path[0] = str(Path(argv[0]).resolve().parent)  # as the script will see it: its own modules first
    try:
        for name in (*WARM_MODULES, *program_imports(list(argv))):
            if name.split(".")[0] in COLD_MODULES:
                continue
            try:
                importlib.import_module(name)
            except Exception:  # the program will meet it itself, and say so
                continue
        while not os.path.exists(go):
            time.sleep(POLL_S)
    except KeyboardInterrupt:  # Ctrl-C at the terminal reaches standby ranks too: they never ran, nothing to say
        os._exit(130)
    return True


def park(env=None) -> bool:
    """Where a program that knows its own slow start (``gpurig train``: its data) has a standby rank wait, after
    that start; its launcher sets ``GPURIG_PARKS_ITSELF=1`` so that pyrun does not park it earlier. False in a rank
    that is not parked.

    >>> park({})
    False
    """
    env = os.environ if env is None else env
    if not env.get(PARK_VARIABLE):
        return False
    return wait_if_parked([], {**env, PARKS_ITSELF_VARIABLE: ""})


def still_parked(env=None) -> bool:
    """Whether this is a standby rank its launcher has not released yet.

    >>> still_parked({}), still_parked({PARK_VARIABLE: "/nonexistent/go"})
    (False, True)
    """
    go = (os.environ if env is None else env).get(PARK_VARIABLE)
    return bool(go) and not os.path.exists(go)


def release(go: str | os.PathLike) -> None:
    """Let the standby ranks waiting for ``go`` run.

    >>> import tempfile; go = Path(tempfile.mkdtemp()) / "go"
    >>> release(go); wait_if_parked([], {PARK_VARIABLE: str(go)})
    True
    """
    Path(go).touch()
