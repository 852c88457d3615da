"""The 8-bit codecs' CPU kernels in C (and the numerical guard's copy), compiled once per machine, loaded with ctypes.

On a CPU rank the codec is memory-bound: the torch version of encode-with-
feedback reads and writes the gradient seven times (add the residual, max,
min, scale, round, convert, residual), the C loop once per 4 KB block, which
stays in the L1 cache. The library is built at first use into
``$XDG_CACHE_HOME/gpurig`` (``~/.cache/gpurig``), named by a digest of the
source, the flags and the CPU's instruction sets (a home directory shared by
different machines gets one build per kind of CPU), and renamed into place
atomically. Without a compiler, or with ``GPURIG_NATIVE=0``, :func:`library`
returns None and the torch functions are used: same codes, same scales.

>>> lib = library()
>>> lib is None or hasattr(lib, "int8_encode_feedback")
True
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
import threading
from pathlib import Path

SOURCE = Path(__file__).with_name("int8.c")
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-shared", "-fPIC"]
_lock = threading.Lock()
_loaded: list = []  # [library or None] once tried


def compiler() -> str | None:
    """The C compiler Python was built with if it is here, else cc or gcc; None if there is none."""
    configured = (sysconfig.get_config_var("CC") or "").split()
    for candidate in ([configured[0]] if configured else []) + ["cc", "gcc"]:
        if shutil.which(candidate):
            return shutil.which(candidate)
    return None


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def cache_dir() -> Path:
    """Where built kernels are kept: ``$XDG_CACHE_HOME/gpurig``, else ``~/.cache/gpurig``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpurig"


def library():
    """The compiled kernels (a ``ctypes.CDLL``), built on first use; None where they cannot be."""
    with _lock:
        if not _loaded:
            _loaded.append(_load())
        return _loaded[0]


def _load():
    if os.environ.get("GPURIG_NATIVE", "1") == "0":
        return None
    cc = compiler()
    if cc is None:
        return None
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join([cc, *FLAGS]).encode()
                            + _cpu_signature().encode()).hexdigest()[:16]
    target = cache_dir() / f"int8-{digest}.so"
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                built = Path(tmp) / target.name
                subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(built)], check=True, capture_output=True,
                               timeout=60)
                os.replace(built, target)  # atomic: ranks building at once each install a whole file
        lib = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError):
        return None
    pointer, size = ctypes.c_void_p, ctypes.c_long
    lib.int8_encode_feedback.argtypes = [pointer, pointer, ctypes.c_int, pointer, pointer, size, size, ctypes.c_float]
    lib.int8_encode_feedback.restype = None
    lib.int8_decode.argtypes = [pointer, pointer, pointer, size, size]
    lib.int8_decode.restype = None
    lib.dynamic_encode_feedback.argtypes = [pointer, pointer, ctypes.c_int, pointer, pointer, size, size,
                                            ctypes.c_float, pointer]
    lib.dynamic_encode_feedback.restype = None
    lib.dynamic_decode.argtypes = [pointer, pointer, pointer, size, size, pointer, pointer]
    lib.dynamic_decode.restype = None
    lib.scale_copy_flag.argtypes = [pointer, pointer, size, ctypes.c_float]
    lib.scale_copy_flag.restype = ctypes.c_int
    for name in ("fp16_encode_feedback", "bf16_encode_feedback"):  # fp16: where the compiler has _Float16
        if hasattr(lib, name):
            getattr(lib, name).argtypes = [pointer, pointer, ctypes.c_int, pointer, size]
            getattr(lib, name).restype = None
    return lib
