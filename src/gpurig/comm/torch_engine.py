"""The torch.distributed engine: Gloo on CPU, NCCL on GPU.

Gloo's all-gather and reduce-scatter want equal pieces from every rank; uneven
pieces are padded to the largest and trimmed afterwards.
"""

from __future__ import annotations

import datetime
import gc
import os
import socket
import threading
import time

import torch
import torch.distributed as dist

from gpurig.comm.sidechannel import SideChannel, rendezvous_store
from gpurig.comm.signature import COLLECTIVES
from gpurig.errors import UsageError
from gpurig.launch.env import restart_count, torch_launch_info
from gpurig.launch.processes import say
from gpurig.launch.settings import Settings

# torch 2.13 renamed these; older releases only have the old names.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
GLOO_DEVICE_COLLECTIVES = frozenset({"allreduce", "broadcast"})


class TorchEngine:
    """Blocking collectives on flat, contiguous tensors over the default process group.

    Reads RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (torchrun, ``gpurig run
    --engine torch``) or SLURM's variables; a process started by hand is a group of one.

    >>> engine = TorchEngine()          # doctest: +SKIP
    >>> engine.backend                  # doctest: +SKIP
    'gloo'
    """

    name = "torch"
    native_async = True  # Gloo and NCCL run async_op collectives on their own threads

    def __init__(self, backend: str | None = None, timeout_s: float | None = None):
        info = torch_launch_info()
        self.backend = backend or os.environ.get("GPURIG_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
        timeout = datetime.timedelta(seconds=timeout_s or Settings.from_env().comm_timeout)
        self._owns_group = not dist.is_initialized()
        self.side_channel = None
        if self._owns_group:
            device = None
            if self.backend == "nccl":  # NCCL binds the group to this rank's GPU; say which instead of letting it guess
                device = torch.device("cuda", (info.local_rank or 0) % torch.cuda.device_count())
                torch.cuda.set_device(device)
            if info.size is None or info.size == 1:
                dist.init_process_group(self.backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout,
                                        device_id=device)
            else:
                if info.rank is None or not 0 <= info.rank < info.size:
                    raise UsageError(f"RANK={os.environ.get('RANK')!r} with WORLD_SIZE={info.size}: a rank is a whole "
                                     f"number from 0 to {info.size - 1} (left over from another job? unset RANK and "
                                     "WORLD_SIZE, or start the job with `gpurig run` or torchrun)")
                os.environ.setdefault("RANK", str(info.rank))
                os.environ.setdefault("WORLD_SIZE", str(info.size))
                self.side_channel = _join(self.backend, info.rank, info.size, timeout, device)
        else:   # the script made the group itself (a torchrun-style DDP script): share its store, when a TCPStore
            self.side_channel = _side_channel_of_users_group()
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        self.local_rank = info.local_rank if info.local_rank is not None else self.rank
        self.local_size = info.local_size if info.local_size is not None else self.size
        # NCCL moves device memory only. Gloo stages a CUDA tensor through pinned memory on its own streams for
        # allreduce and broadcast (as DDP over Gloo relies on), so the copies overlap backward; its other
        # collectives take host tensors, which the communicator stages itself.
        self.device_collectives = COLLECTIVES if self.backend == "nccl" else GLOO_DEVICE_COLLECTIVES
        self.needs_device_tensors = self.backend == "nccl"

    def supports(self, dtype: torch.dtype) -> bool:
        return dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                         torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool)

    def allreduce_sum(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor)

    def start_allreduce(self, tensor: torch.Tensor):
        """Begin :meth:`allreduce_sum` in place; returns the backend's ``Work``."""
        return dist.all_reduce(tensor, async_op=True)

    def allgather(self, tensor: torch.Tensor, counts: list[int]) -> torch.Tensor:
        largest = max(counts)
        if tensor.numel() < largest:
            tensor = torch.cat([tensor, tensor.new_zeros(largest - tensor.numel())])
        out = tensor.new_empty(largest * self.size)
        _all_gather(out, tensor)
        if all(c == largest for c in counts):
            return out
        return torch.cat([out[r * largest: r * largest + c] for r, c in enumerate(counts)])

    def reduce_scatter_sum(self, tensor: torch.Tensor, counts: list[int]) -> torch.Tensor:
        largest = max(counts)
        if any(c != largest for c in counts):
            padded = tensor.new_zeros(largest * self.size)
            start = 0
            for r, c in enumerate(counts):
                padded[r * largest: r * largest + c] = tensor[start: start + c]
                start += c
            tensor = padded
        out = tensor.new_empty(largest)
        _reduce_scatter(out, tensor)
        return out[: counts[self.rank]]

    def alltoall(self, tensor: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(tensor)
        dist.all_to_all_single(out, tensor)
        return out

    def start_alltoall(self, tensor: torch.Tensor, out: torch.Tensor):
        """Begin :meth:`alltoall` into ``out``; returns the backend's ``Work`` (Gloo moves it on its own threads)."""
        return dist.all_to_all_single(out, tensor, async_op=True)

    def start_reduce_scatter(self, tensor: torch.Tensor, out: torch.Tensor):
        """Begin a reduce-scatter (sum) of equal pieces into ``out`` (this rank's piece); returns the backend's ``Work``."""
        return _reduce_scatter(out, tensor, async_op=True)

    def start_allgather(self, tensor: torch.Tensor, out: torch.Tensor):
        """Begin an allgather of equal pieces into ``out``; returns the backend's ``Work``."""
        return _all_gather(out, tensor, async_op=True)

    def broadcast(self, tensor: torch.Tensor, root: int, async_op: bool = False):
        return dist.broadcast(tensor, src=root, async_op=async_op)

    def barrier(self) -> None:
        dist.barrier()

    def abort(self, code: int) -> None:
        """End this process now, whatever its threads are blocked in; the launcher then stops the others."""
        os._exit(code)

    def shutdown(self) -> None:
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            # the rendezvous store (the side channel's) closes its port with its last reference: a later init
            # serves a new one on the same MASTER_PORT
            self.side_channel = None
            # Drop the last references to the group and its finished work now: Gloo's worker threads
            # release tensors on their own, and one that does so while Python is finalizing aborts
            # the process ("terminate called without an active exception").
            gc.collect()


FIRST_REPORT_S = 15.0   # a rendezvous still waiting after this says so (then every minute)
# what a rendezvous nobody joins raises (not DistBackendError: NCCL's own failures say what they are)
_RENDEZVOUS_ERRORS = tuple(getattr(dist, name) for name in ("DistStoreError", "DistNetworkError")
                           if hasattr(dist, name)) or (RuntimeError,)


def _join(backend: str, rank: int, size: int, timeout: datetime.timedelta, device) -> SideChannel:
    """Join the default process group at ``MASTER_ADDR:MASTER_PORT`` as ``rank`` of ``size``; return the side channel.

    The rendezvous store, bound to MASTER_ADDR's interface only, is also gpurig's side channel. A rendezvous
    that waits says so on stderr after 15 s (half the timeout, when shorter) and every minute; one that times
    out is a one-line :class:`UsageError` saying where it waited, not torch's traceback ten minutes later.

    >>> channel = _join("gloo", 0, 2, datetime.timedelta(seconds=30), None)   # doctest: +SKIP
    """
    where = f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ.get('MASTER_PORT', '29500')}"
    seconds = timeout.total_seconds()
    if rank == 0:
        waiting = f"rank 0 of {size} has waited {{:.0f}} s for the other ranks to join at {where}"
        failed = (f"rank 0 of {size}: the other ranks did not join at {where} within {seconds:.0f} s "
                  "(RANK, WORLD_SIZE and MASTER_ADDR/PORT left over from another job? start a job with "
                  "`gpurig run` or torchrun)")
    else:
        waiting = f"rank {rank} of {size} has waited {{:.0f}} s to reach rank 0 at {where}"
        failed = (f"rank {rank} of {size} could not reach rank 0 at {where} within {seconds:.0f} s (is rank 0 "
                  "running, and MASTER_ADDR an address of its machine that this one can reach?)")
    done = threading.Event()
    threading.Thread(target=_report_waiting, args=(done, waiting, seconds), name="gpurig-rendezvous",
                     daemon=True).start()
    try:
        if rank != 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            _wait_for_listener(where, seconds)   # here, not in torch's client: it logs each try in C++
        store, channel = rendezvous_store(rank, size, seconds)
        dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout, device_id=device)
    except (*_RENDEZVOUS_ERRORS, TimeoutError):
        raise UsageError(failed) from None
    finally:
        done.set()
    return channel


def _wait_for_listener(where: str, timeout_s: float) -> None:
    """Return once something accepts connections at ``where`` (HOST:PORT); TimeoutError after ``timeout_s``."""
    host, port = where.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=min(1.0, timeout_s)).close()
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise TimeoutError(where) from None
            time.sleep(0.2)


def _report_waiting(done: threading.Event, line: str, timeout_s: float) -> None:
    """Say ``line`` (its ``{}`` the seconds waited) after :data:`FIRST_REPORT_S` (or half the timeout, when shorter)
    and every minute, until ``done``."""
    waited, step = 0.0, min(FIRST_REPORT_S, timeout_s / 2)
    while not done.wait(step):
        waited += step
        say(f"gpurig: {line.format(waited)} (gives up after {timeout_s:.0f} s, GPURIG_COMM_TIMEOUT)")
        step = 60.0


def _side_channel_of_users_group() -> SideChannel | None:
    """A side channel on the TCPStore behind a process group the script initialised itself (``env://``, as torchrun
    and ``gpurig run`` set it up), under keys of its own; None for any other store (a file, a hash store).

    >>> _side_channel_of_users_group().prefix     # doctest: +SKIP
    'gpurig/attempt_0/'
    """
    try:
        store = dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):   # a private function: any other release, no channel
        return None
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if not isinstance(store, dist.TCPStore):
        return None
    # under its own keys, and an attempt's own where torchrun's agent store outlives attempts
    return SideChannel(store.host, store.port, prefix=f"gpurig/attempt_{restart_count()}/")
