"""Collectives by message size on every rank: gpurig's Communicator and the raw engine call, interleaved.

Run by ``gpurig bench`` as ``python -m gpurig.measure.comm CONFIG.json`` on
each rank of a job started by :func:`gpurig.launch.run_job`. For each
collective (allreduce, allgather, broadcast) and size, as nccl-tests measures:
after a warm-up, loops of back-to-back calls of the same in-place collective,
the Communicator's and the engine's own call (mpi4py ``Allreduce(IN_PLACE)`` /
``Allgather`` / ``Bcast`` on the same buffers, or ``torch.distributed``'s
``all_reduce`` / ``all_gather_single`` / ``broadcast``) taking turns loop by
loop, so the noise of a shared machine hits both. A loop lasts as long as its
slowest rank; the median over loops is reported. Point-to-point: rank 0 and rank 1 ping-pong through the engine.

Sizes are nccl-tests': for allgather, the gathered output (each rank gives 1/n of it).
Rank 0 appends one JSON line per measurement to ``CONFIG["events"]``. The
Communicator's check that ranks submit the same collectives is off here: bench
measures the path the data takes (benchmarks/check_overhead.py measures the check).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from gpurig import comm as comm_mod
from gpurig.perf.busbw import algbw, busbw
from gpurig.timing import device_sync, timed_turns

COLLECTIVES = ("allreduce", "allgather", "broadcast")
COMPRESSED_VALUES = (1 << 16, 1 << 18, 1 << 20, 1 << 22)  # gradient values per compressed average timed
POSTED_VALUES_MAX = 1 << 18  # ... and what posting one costs, up to this size (larger ones would wait on the link)
OVERLAP_SPIN_S = 30.0  # the longest measure_overlap computes beside one round of allreduces


def sizes(min_bytes: int, max_bytes: int, step: int = 4) -> list[int]:
    """Message sizes from ``min_bytes`` to ``max_bytes``, multiplying by ``step``.

    >>> sizes(1024, 65536)
    [1024, 4096, 16384, 65536]
    """
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= step
    return out


def iterations(nbytes: int, budget_bytes: float, low: int, high: int) -> int:
    """Iterations for a size: about ``budget_bytes`` of traffic, between ``low`` and ``high``.

    >>> iterations(1024, 2**26, 5, 200), iterations(2**26, 2**26, 5, 200)
    (200, 5)
    """
    return max(low, min(high, int(budget_bytes // nbytes)))


def raw_calls(comm, collective: str, buf: torch.Tensor, out: torch.Tensor):
    """The engine's own call for ``collective`` on ``buf`` (``out`` for allgather), bypassing gpurig."""
    if comm.engine.name == "mpi":
        from mpi4py import MPI

        world = comm.engine.comm
        send, recv = [buf.numpy(), MPI.FLOAT], [out.numpy(), MPI.FLOAT]
        return {"allreduce": lambda: world.Allreduce(MPI.IN_PLACE, send, op=MPI.SUM),
                "allgather": lambda: world.Allgather(send, recv),
                "broadcast": lambda: world.Bcast(send, root=0)}[collective]
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    return {"allreduce": lambda: dist.all_reduce(buf),
            "allgather": lambda: gather(out, buf),
            "broadcast": lambda: dist.broadcast(buf, src=0)}[collective]


def gpurig_call(comm, collective: str, buf: torch.Tensor):
    """The Communicator's call for ``collective`` on ``buf``."""
    return {"allreduce": lambda: comm.allreduce(buf, op="sum"),
            "allgather": lambda: comm.allgather(buf, sizes=[buf.shape[0]] * comm.size),  # equal parts, as nccl-tests
            "broadcast": lambda: comm.broadcast(buf, root=0)}[collective]


def timed_pairs(a, b, n: int, before=None) -> tuple[list[float], list[float]]:
    """``n`` timings of ``a`` and of ``b``, called back to back, alternating which goes first; ``before()``
    (untimed) ahead of each call if given."""
    times: dict = {a: [], b: []}
    for i in range(n):
        for fn in ((a, b) if i % 2 == 0 else (b, a)):
            if before is not None:
                before()
            start = time.perf_counter()
            fn()
            times[fn].append(time.perf_counter() - start)
    return times[a], times[b]


def loop_shape(n: int, most_per_loop: int = 20) -> tuple[int, int]:
    """``n`` calls as (loops, calls per loop): at least 3 loops, at most ``most_per_loop`` calls in each
    (nccl-tests times 20 back-to-back iterations by default).

    >>> loop_shape(200), loop_shape(10), loop_shape(3)
    ((10, 20), (3, 3), (3, 1))
    """
    per_loop = max(1, min(most_per_loop, n // 3))
    return max(3, n // per_loop), per_loop


def timed_loops(a, b, loops: int, per_loop: int) -> tuple[list[float], list[float]]:
    """Seconds per call of ``a`` and of ``b``, each timed as ``per_loop`` back-to-back calls (as nccl-tests
    times a collective), the two loops taking turns ``loops`` times, which goes first flipping each time.

    >>> ours, raw = timed_loops(lambda: None, lambda: None, loops=3, per_loop=2)
    >>> len(ours), len(raw)
    (3, 3)
    """
    times: dict = {a: [], b: []}
    for i in range(loops):
        for fn in ((a, b) if i % 2 == 0 else (b, a)):
            start = time.perf_counter()
            for _ in range(per_loop):
                fn()
            times[fn].append((time.perf_counter() - start) / per_loop)
    return times[a], times[b]


def slowest(comm, values: list[float]) -> list[float]:
    """Per iteration, the slowest rank's time."""
    gathered = comm.allgather(torch.tensor(values, dtype=torch.float64)).view(comm.size, -1)
    return gathered.max(dim=0).values.tolist()


def measure_collective(comm, collective: str, nbytes: int, n: int, warmup: int, isolated: bool = False) -> dict:
    """One size of one collective, as nccl-tests measures it: gpurig's and the engine's times, algbw and busbw.

    The same in-place call on the same buffer, ``warmup`` calls first, then
    loops of back-to-back calls (:func:`loop_shape` of ``n``), gpurig's and the
    raw engine call's taking turns; a loop lasts as long as its slowest rank,
    the median over loops counts. ``isolated`` adds ``isolated_seconds`` and
    ``raw_isolated_seconds``: single calls each after a barrier, so each one
    starts on a quiet link with all ranks ready, as a training step's buckets do
    (what ``predict``'s calibration fits; back to back over TCP, a large
    allreduce often took twice its wire time).
    """
    count = nbytes // 4
    per_rank = count // comm.size if collective == "allgather" else count
    buf = torch.zeros(max(per_rank, 1))
    out = torch.zeros(max(per_rank, 1) * comm.size)
    ours, raw = gpurig_call(comm, collective, buf), raw_calls(comm, collective, buf, out)
    for _ in range(warmup):
        ours()
        raw()
    loops, per_loop = loop_shape(n)
    ours_t, raw_t = timed_loops(ours, raw, loops, per_loop)
    ours_t, raw_t = slowest(comm, ours_t), slowest(comm, raw_t)
    total = max(per_rank, 1) * 4 * (comm.size if collective == "allgather" else 1)
    ours_s, raw_s = statistics.median(ours_t), statistics.median(raw_t)
    paired = statistics.median(r / o for r, o in zip(raw_t, ours_t))
    row = {"collective": collective, "bytes": total, "iterations": loops * per_loop, "seconds": ours_s,
           "raw_seconds": raw_s, "algbw_gbs": algbw(total, ours_s) / 1e9,
           "busbw_gbs": busbw(collective, total, ours_s, comm.size) / 1e9,
           "raw_busbw_gbs": busbw(collective, total, raw_s, comm.size) / 1e9, "raw_over_gpurig": paired}
    if isolated:
        ours_i, raw_i = timed_pairs(ours, raw, n, comm.barrier)
        row.update(isolated_seconds=statistics.median(slowest(comm, ours_i)),
                   raw_isolated_seconds=statistics.median(slowest(comm, raw_i)))
    return row


def measure_p2p(comm, nbytes: int, n: int, warmup: int) -> dict | None:
    """Rank 0 ↔ rank 1 ping-pong through the engine: one-way time and bandwidth; other ranks wait."""
    buf = torch.zeros(max(nbytes // 4, 1))
    if comm.engine.name == "mpi":
        from mpi4py import MPI

        world, msg = comm.engine.comm, [buf.numpy(), MPI.FLOAT]
        send, recv = (lambda peer: world.Send(msg, dest=peer)), (lambda peer: world.Recv(msg, source=peer))
    else:
        import torch.distributed as dist

        send, recv = (lambda peer: dist.send(buf, dst=peer)), (lambda peer: dist.recv(buf, src=peer))
    times = []
    for i in range(warmup + n):
        start = time.perf_counter()
        if comm.rank == 0:
            send(1)
            recv(1)
        elif comm.rank == 1:
            recv(0)
            send(0)
        if i >= warmup:
            times.append((time.perf_counter() - start) / 2)
    comm.barrier()
    one_way = statistics.median(times)
    return {"collective": "sendrecv", "bytes": buf.numel() * 4, "iterations": n, "seconds": one_way,
            "algbw_gbs": algbw(buf.numel() * 4, one_way) / 1e9,
            "busbw_gbs": busbw("sendrecv", buf.numel() * 4, one_way, 2) / 1e9}


MATRICES_TIMED = 8  # PowerSGD's chain timed again with its values in this many matrices: the cost of one more


def square_ish(values: int, matrices: int = 1) -> list[torch.Size]:
    """``matrices`` equal, near-square weight matrices holding ``values`` in all (what PowerSGD factors).

    >>> square_ish(1 << 16), square_ish(1 << 16, 2)
    ([torch.Size([256, 256])], [torch.Size([128, 256]), torch.Size([128, 256])])
    """
    each = values // matrices
    side = 1 << (each.bit_length() - 1) // 2
    return [torch.Size([side, each // side])] * matrices


def _time_chain(comm, method: str, shapes: list[torch.Size], n: int, warmup: int) -> float:
    """The slowest rank's median time of DataParallel's compressed average of one bucket of ``shapes``."""
    from gpurig.parallel.compression import FeedbackState, timed_average

    x = torch.randn(sum(s.numel() for s in shapes), device=comm.device)
    state = FeedbackState()
    times = [timed_average(comm, x, method, state, shapes) for _ in range(warmup + n)][warmup:]
    return statistics.median(slowest(comm, times))


def measure_compressed(comm, method: str, values: int, n: int, warmup: int, posting: bool = True) -> dict:
    """One size of a compressed average (DataParallel's path for ``method``): its median time, each call after
    a barrier as a step's buckets start. The bytes are the float32 gradient's, so the fit reads per value.

    The whole chain is timed — encode, the pieces' all-to-alls, decode and add,
    encode, the allgathers, decode (PowerSGD: its products, two allreduces and
    the orthogonalisation, on a square-ish matrix) — as a bucket takes it, with its
    synchronisation between the ranks, not the codec and the wire apart.
    PowerSGD works matrix by matrix, so its chain is timed again with the same
    values in :data:`MATRICES_TIMED` matrices: ``per_matrix_s`` is what each
    matrix beyond the first adds (a bucket of a real model holds several).
    Up to :data:`POSTED_VALUES_MAX` values (and with ``posting``), ``posted_s`` is
    what posting such a bucket under computation costs it (:func:`posting_seconds`):
    on CPU ranks the chain runs on the communication thread, beside backward, on its cores.
    """
    seconds = _time_chain(comm, method, square_ish(values), n, warmup)
    extra = {}
    if method.startswith("powersgd"):
        split = _time_chain(comm, method, square_ish(values, MATRICES_TIMED), n, warmup)
        extra["per_matrix_s"] = max(0.0, split - seconds) / (MATRICES_TIMED - 1)
    if posting and values <= POSTED_VALUES_MAX:
        product, sync = stand_in_product(comm.device)
        extra["posted_s"] = posting_seconds(comm, product, sync, rounds=n + 2,
                                            post=compressed_posting(comm, method, values))[1]
    return {"collective": f"compressed:{method}", "bytes": values * 4, "iterations": n, "seconds": seconds,
            "algbw_gbs": algbw(values * 4, seconds) / 1e9, "busbw_gbs": busbw("allreduce", values * 4, seconds,
                                                                               comm.size) / 1e9, **extra}


def compressed_posting(comm, method: str, values: int, posted: int = 2):
    """:func:`posting_seconds`'s ``post`` for compressed buckets of ``values`` gradients: the ``i``-th posting
    begins a compressed average with ``method`` on the communication thread, as DataParallel begins a bucket.

    >>> post = compressed_posting(comm, "int8", 1 << 16)      # doctest: +SKIP
    >>> post(0).wait()                                        # doctest: +SKIP
    """
    from gpurig.parallel.compression import FeedbackState, average, collectives

    shapes = square_ish(values)
    values = sum(s.numel() for s in shapes)
    bufs = [torch.randn(values, device=comm.device) for _ in range(posted)]
    states = [FeedbackState() for _ in range(posted)]
    begun, finished = collectives(values, comm.size, method, shapes=shapes)

    def post(i: int):
        comm.expect(begun + finished)  # DataParallel checks its buckets' collectives so, once a step
        return comm.run_async(lambda: average(comm, bufs[i], method, states[i], shapes))
    return post


def stand_in_product(device: torch.device):
    """(product, sync): a matrix product of a few milliseconds on a CPU (backward runs such ones back to back),
    and the device's synchronisation.

    >>> product, sync = stand_in_product(torch.device("cpu"))
    >>> product().shape
    torch.Size([128, 1024])
    """
    a, b = torch.randn(128, 1024, device=device), torch.randn(1024, 1024, device=device)
    return (lambda: torch.mm(a, b)), device_sync(device)


def measure_overlap(comm, nbytes: int, rounds: int = 5) -> dict:
    """How much slower computing is while a collective is in flight on this rank: the ``slowdown`` factor.

    A matrix product of a few milliseconds (on a CPU; a backward pass runs
    such ones back to back) is timed alone, then again and again while
    allreduces of ``nbytes`` begun on the Communicator's async path (as
    DataParallel's buckets are; testing the last one between products also
    moves them, as DataParallel's gradients do) keep the link busy; only products that finished
    before the last allreduce did count. On a CPU rank the communication thread
    shares the cores (Open MPI polls, the TCP stack copies), so backward runs
    slower while buckets travel; on a GPU, the collective's kernels share the
    SMs. The median over ``rounds``, averaged over the ranks.
    """
    device = comm.device
    mm, sync = stand_in_product(device)
    buf = torch.zeros(max(nbytes // 4, 1), device=device)

    def product() -> float:
        start = time.perf_counter()
        mm()
        sync()
        return time.perf_counter() - start

    for _ in range(3):
        product()
    alone = [product() for _ in range(5)]
    comm.barrier()
    start = time.perf_counter()
    for _ in range(3):
        comm.allreduce(buf, op="sum")
    one = (time.perf_counter() - start) / 3
    # enough allreduces in a row to cover several products (agreed by all ranks: they must queue the same)
    queued = int(comm.allreduce(torch.tensor([math.ceil(6 * statistics.median(alone) / one)]), op="sum").item()
                 // comm.size) or 1
    during = []
    for _ in range(rounds):
        comm.barrier()
        alone += [product() for _ in range(3)]
        comm.barrier()
        handles = [comm.allreduce_async(buf, op="sum") for _ in range(queued)]
        # bounded: a handle that never says it completed (an engine's Work that only wait() finishes) must not
        # spin here for ever; wait() below finishes it either way
        deadline = time.perf_counter() + OVERLAP_SPIN_S
        while time.perf_counter() < deadline:
            t = product()
            if handles[-1].is_completed():  # this one may have run partly after the last allreduce: not counted
                break
            during.append(t)
        for handle in handles:
            handle.wait()
    alone_s = statistics.median(alone)
    during_s = statistics.median(during) if during else alone_s
    slowdown = comm.allreduce(torch.tensor([during_s / alone_s], dtype=torch.float64), op="average").item()
    chain_s, posted_s = posting_seconds(comm, mm, sync)
    return {"collective": "overlap", "bytes": buf.numel() * 4, "queued": queued, "product_s": alone_s,
            "product_during_s": during_s, "samples": len(during), "slowdown": max(1.0, slowdown),
            "chain_s": chain_s, "posted_s": posted_s}


def posting_seconds(comm, product, sync, products: int = 8, posted: int = 2, rounds: int = 15,
                    post=None) -> tuple[float, float]:
    """What posting a collective costs the computation it is posted under: (chain alone, seconds per posting).

    A chain of ``products`` calls of ``product`` (as backward runs layers) is
    timed alone and with ``posted`` small allreduces begun on the async path
    at evenly spaced points of it (as DataParallel begins a bucket once its
    gradients are ready), each waited on at the end; the two take turns after
    a barrier, and each of ``rounds`` rounds gives one difference, of which
    the median counts (the cost varies from one posting to the next, with
    where the scheduler puts the threads). The allreduces carry 16 KB, so
    what they add is not bandwidth: it is beginning them (the engine's
    nonblocking call, on this thread) and waiting for the other ranks at the
    end — where a collective is handed to a thread (Gloo's own, or gpurig's
    for what has no nonblocking form), also waking that thread, which on CPU
    ranks must take a core from a computing thread and in Open MPI spins
    until the other ranks are scheduled too: milliseconds a collective on
    this 2-core machine (benchmarks/handoff.py); where cores are free (a GPU
    rank's host), next to nothing. The ranks' mean.

    ``post(i)``, if given, posts the ``i``-th of a chain's collectives instead
    and returns its handle (:func:`compressed_posting`: a compressed bucket).

    >>> posting_seconds(comm, lambda: torch.mm(a, b), lambda: None)     # doctest: +SKIP
    (0.0301, 0.0041)
    """
    if post is None:
        bufs = [torch.zeros(4096, device=comm.device) for _ in range(posted)]
        post = lambda i: comm.allreduce_async(bufs[i], op="sum")  # noqa: E731
    at = {1 + i * products // posted for i in range(posted)}   # after the 1st and 5th of 8 products

    def chain(posting: bool):
        def run():
            handles = []
            for i in range(products):
                if posting and i in at:
                    handles.append(post(len(handles)))
                product()
            for handle in handles:
                handle.wait()
        return run

    pairs = [timed_turns([chain(False), chain(True)], rounds=1, sync=sync, before=comm.barrier)
             for _ in range(rounds)]
    alone_s = statistics.median(alone for alone, _ in pairs)
    cost_s = statistics.median((with_s - alone) / posted for alone, with_s in pairs)
    per = comm.allreduce(torch.tensor([alone_s, cost_s], dtype=torch.float64), op="average").tolist()
    return per[0], max(0.0, per[1])


def run(config: dict) -> None:
    """Every measurement the config asks for; rank 0 appends each result to ``config["events"]``."""
    comm = comm_mod.init()
    comm.guard.check = False  # every rank runs the same plan; only the data path is measured
    torch.set_num_threads(1)
    events = open(config["events"], "a") if comm.rank == 0 else None

    def emit(**fields):
        if events is not None:
            events.write(json.dumps(fields) + "\n")
            events.flush()

    emit(event="start", ranks=comm.size, engine=comm.engine_name)
    plan = [(c, s) for c in config["collectives"] for s in sizes(config["min_bytes"], config["max_bytes"])]
    if config.get("p2p") and comm.size >= 2:
        plan += [("sendrecv", s) for s in sizes(config["min_bytes"], config["max_bytes"])]
    for collective, nbytes in plan:
        n = iterations(nbytes, config["budget_bytes"], config["min_iterations"], config["max_iterations"])
        if collective == "sendrecv":
            row = measure_p2p(comm, nbytes, n, config["warmup"])
        else:
            row = measure_collective(comm, collective, nbytes, n, config["warmup"], config.get("isolated", False))
        emit(event="row", engine=comm.engine_name, ranks=comm.size, **row)
    if comm.size >= 2:
        for method in config.get("compressed", []):
            for values in config.get("compressed_values", COMPRESSED_VALUES):
                emit(event="row", engine=comm.engine_name, ranks=comm.size,
                     **measure_compressed(comm, method, values, config.get("compressed_iterations", 7), 2))
    if config.get("overlap") and comm.size >= 2:
        emit(event="row", engine=comm.engine_name, ranks=comm.size,
             **measure_overlap(comm, config["max_bytes"]))
    emit(event="done")
    if events is not None:
        events.close()


if __name__ == "__main__":
    run(json.loads(Path(sys.argv[1]).read_text()))
