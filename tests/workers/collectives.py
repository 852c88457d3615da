"""Every collective, every dtype, uneven and empty sizes, blocking and async, on the engine under test."""

import torch

import gpurig
from casekit import case, write

comm = gpurig.init()
R, P = comm.rank, comm.size
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.float64]


def value(rank, n, dtype):
    """Rank-dependent integers, exact in every dtype."""
    return (torch.arange(n) % 7 + rank * 3).to(dtype)


def total(n, dtype):
    return sum(value(r, n, torch.int64) for r in range(P)).to(dtype) if n else torch.empty(0, dtype=dtype)


for dtype in DTYPES:
    for n in (0, 1, P + 1, 1000 * P + 1):
        @case(f"allreduce_sum[{dtype}-{n}]")
        def _():
            t = value(R, n, dtype)
            out = comm.allreduce(t, op="sum")
            assert out is t and torch.equal(t, total(n, dtype)), (t, total(n, dtype))

        @case(f"allreduce_async[{dtype}-{n}]")
        def _():
            t = value(R, n, dtype)
            h = comm.allreduce_async(t, op="sum")
            assert torch.equal(h.wait(), total(n, dtype)) and h.is_completed()

        @case(f"allgather_uneven[{dtype}-{n}]")
        def _():
            rows = n + R  # first dimension differs per rank
            t = value(R, rows * 2, dtype).view(rows, 2)
            out = comm.allgather(t)
            want = torch.cat([value(r, (n + r) * 2, dtype).view(n + r, 2) for r in range(P)])
            assert torch.equal(out, want), (out.shape, want.shape)

        @case(f"reduce_scatter[{dtype}-{n}]")
        def _():
            t = value(R, n * 3, dtype).view(n, 3) if n else torch.empty(0, 3, dtype=dtype)
            out = comm.reduce_scatter(t, op="sum")
            full = total(n * 3, dtype).view(n, 3) if n else torch.empty(0, 3, dtype=dtype)
            assert torch.equal(out, torch.tensor_split(full, P)[R]), (out, full)

        @case(f"alltoall[{dtype}-{n}]")
        def _():
            t = value(R, n * P * 2, dtype).view(n * P, 2) if n else torch.empty(0, 2, dtype=dtype)
            out = comm.alltoall(t)
            want = torch.cat([torch.tensor_split(value(r, n * P * 2, dtype).view(n * P, 2), P)[R] for r in range(P)]) \
                if n else t
            assert torch.equal(out, want), (out, want)

        @case(f"broadcast[{dtype}-{n}]")
        def _():
            root = P - 1
            t = value(R, n, dtype)
            comm.broadcast(t, root=root)
            assert torch.equal(t, value(root, n, dtype))

    @case(f"reduce_scatter_async_equal_into_out[{dtype}]")
    def _():  # equal pieces, sum: the engine's own nonblocking reduce-scatter, into the caller's buffer
        t = value(R, 1000 * P, dtype)
        out = torch.empty(1000, dtype=dtype)
        handle = comm.reduce_scatter_async(t, out=out)
        comm.progress()
        assert handle.wait() is out and torch.equal(out, torch.tensor_split(total(1000 * P, dtype), P)[R])

    @case(f"reduce_scatter_async_uneven[{dtype}]")
    def _():
        t = value(R, 3 * P + 1, dtype)
        got = comm.reduce_scatter_async(t, name="uneven").wait()
        assert torch.equal(got, torch.tensor_split(total(3 * P + 1, dtype), P)[R]), got

    @case(f"broadcast_async[{dtype}]")
    def _():
        t = value(R, 17, dtype)
        assert torch.equal(comm.broadcast_async(t, root=0).wait(), value(0, 17, dtype))


@case("allreduce_average_float32")
def _():
    t = torch.full((5,), float(R))
    comm.allreduce(t)
    assert torch.allclose(t, torch.full((5,), sum(range(P)) / P))


@case("reduce_scatter_average")
def _():
    t = torch.full((P * 2 + 1,), float(R + 1))
    out = comm.reduce_scatter(t, op="average")
    assert torch.allclose(out, torch.full_like(out, (P + 1) / 2))


@case("fp16_average_divides_first_where_the_sum_would_overflow")
def _():  # 40000 on every rank: their sum is past fp16's 65504, their mean is not (NCCL's average divides first)
    t = torch.full((4,), 40000.0, dtype=torch.float16)
    assert torch.equal(comm.allreduce(t), torch.full((4,), 40000.0, dtype=torch.float16)), t
    t = torch.full((4,), 40000.0, dtype=torch.float16)
    assert torch.equal(comm.allreduce_async(t).wait(), torch.full((4,), 40000.0, dtype=torch.float16)), t
    rows = torch.full((P * 2, 3), 40000.0, dtype=torch.float16)
    out = comm.reduce_scatter(rows, op="average")
    assert torch.equal(out, torch.full((2, 3), 40000.0, dtype=torch.float16)), out
    assert torch.equal(rows, torch.full((P * 2, 3), 40000.0, dtype=torch.float16))  # its input left alone


@case("a_tensor_that_requires_grad_is_refused_after_its_shape_was_seen")
def _():  # the short path of a known (dtype, shape) allreduce refuses it too, before any byte moves
    comm.allreduce(torch.ones(3), op="sum", name="seen with requires_grad later")
    p = torch.full((3,), float(R + 1), requires_grad=True)
    try:
        comm.allreduce(p, op="sum", name="seen with requires_grad later")
    except TypeError as e:
        assert "requires grad" in str(e)
    else:
        raise AssertionError("no error")
    assert torch.equal(p.detach(), torch.full((3,), float(R + 1)))


@case("more_elements_than_an_mpi_count_go_in_pieces")
def _():
    """A blocking allreduce or broadcast past MAX_COUNT elements (an MPI count is a C int) goes in pieces."""
    from gpurig.comm import mpi_engine

    saved, mpi_engine.MAX_COUNT = mpi_engine.MAX_COUNT, 5
    try:
        t = value(R, 13, torch.float32)
        assert torch.equal(comm.allreduce(t, op="sum", name="past the count"), total(13, torch.float32))
        t = value(R, 13, torch.int64)
        assert torch.equal(comm.broadcast(t, root=P - 1), value(P - 1, 13, torch.int64))
    finally:
        mpi_engine.MAX_COUNT = saved


@case("allreduce_noncontiguous")
def _():
    t = value(R, 12, torch.float32).view(3, 4).t()
    comm.allreduce(t, op="sum")
    assert torch.equal(t, total(12, torch.float32).view(3, 4).t())


@case("bool_sum_is_logical_or")
def _():  # MPI has no sum of C bools (MPI_ERR_OP); torch.distributed's is their logical or: both engines give that
    flags = torch.tensor([R == 0, False, True, R == P - 1] * P)
    want = torch.tensor([True, False, True, True] * P)
    assert torch.equal(comm.allreduce(flags.clone(), op="sum"), want)
    assert torch.equal(comm.allreduce(torch.tensor(R == 1), op="sum"), torch.tensor(P > 1))
    assert torch.equal(comm.reduce_scatter(flags.clone().view(P, 4), op="sum"), want.view(P, 4)[R:R + 1])


@case("average_of_integers_is_refused")
def _():
    try:
        comm.allreduce(torch.ones(3, dtype=torch.int64))
    except TypeError as e:
        assert "op='sum'" in str(e)
    else:
        raise AssertionError("no error")


@case("async_many_in_flight_keep_order")
def _():
    tensors = [torch.full((1000,), float(R * i)) for i in range(20)]
    handles = [comm.allreduce_async(t, op="sum") for t in tensors]
    mixed = comm.allgather(torch.tensor([R]))  # a blocking call after queued ones
    for i, (t, h) in enumerate(zip(tensors, handles)):
        assert torch.equal(h.wait(), torch.full((1000,), float(sum(r * i for r in range(P)))))
    assert mixed.tolist() == list(range(P))


@case("alltoall_and_allgather_begun_inside_a_job_finish_in_order")
def _():
    """A run_async job starts several non-blocking collectives, computes between them, then waits (the
    compressed averaging's pipeline); results land in the caller's buffers."""
    def job():
        sends = [value(R + k, 4 * P, torch.int64).view(P, 4) for k in range(3)]
        outs = [torch.empty_like(s) for s in sends]
        handles = [comm.alltoall_async(s, out=o) for s, o in zip(sends, outs)]
        mine = [torch.full((1, 5), float(R + 10 * k)) for k in range(3)]
        gathered = [torch.empty(P, 5) for _ in range(3)]
        handles += [comm.allgather_async(m, sizes=[1] * P, out=g) for m, g in zip(mine, gathered)]
        results = [h.wait() for h in handles]
        assert all(r.data_ptr() == o.data_ptr() for r, o in zip(results, outs + gathered))
        return outs, gathered

    outs, gathered = comm.run_async(job).wait()
    for k in range(3):
        want = torch.cat([value(r + k, 4 * P, torch.int64).view(P, 4)[R: R + 1] for r in range(P)])
        assert torch.equal(outs[k], want), (outs[k], want)
        assert torch.equal(gathered[k], torch.tensor([[float(r + 10 * k)] * 5 for r in range(P)]))
    # and from the caller's thread (queued behind nothing, or run by the engine's own threads)
    out = comm.alltoall_async(value(R, 2 * P, torch.float32).view(P, 2)).wait()
    assert torch.equal(out, torch.cat([value(r, 2 * P, torch.float32).view(P, 2)[R: R + 1] for r in range(P)]))


@case("run_async_jobs_interleave_with_async_collectives")
def _():
    a = torch.full((100,), float(R))
    first = comm.allreduce_async(a, op="sum")
    job = comm.run_async(lambda: comm.allgather(comm.allreduce(torch.full((3,), 1.0), op="sum").view(1, 3)))
    b = torch.full((100,), 2.0 * R)
    second = comm.allreduce_async(b, op="sum")  # queued behind the job on every rank
    total_r = float(sum(range(P)))
    assert torch.equal(first.wait(), torch.full((100,), total_r))
    assert torch.equal(job.wait(), torch.full((P, 3), float(P)))
    assert torch.equal(second.wait(), torch.full((100,), 2 * total_r))


@case("an_async_collective_queued_on_one_rank_and_begun_at_once_on_another")
def _():
    """Rank 0's background thread is still busy with a job when the async allreduce comes, the others' are
    idle: every rank must still run the engine's same operation (MPI matches no blocking collective with a
    nonblocking one; this hung when the queued one ran blocking)."""
    import time

    job = comm.run_async(lambda: time.sleep(0.3) if R == 0 else None)
    if R != 0:
        job.wait()
    t = torch.full((1000,), float(R))
    assert torch.equal(comm.allreduce_async(t, op="sum").wait(), torch.full((1000,), float(sum(range(P)))))
    job.wait()


@case("checks_meet_on_a_shared_memory_board_that_leaves_no_file")
def _():
    """All ranks on this machine: the collective check goes through the board (gpurig.comm.checkboard), whose
    file is gone once every rank mapped it."""
    import glob
    import os

    comm.allreduce(torch.ones(3))
    assert (comm.guard._board is not None) == (P > 1 and comm.guard.check)
    if R == 0:
        assert not glob.glob(f"/dev/shm/gpurig-check-{os.getpid()}-*")


@case("async_allreduce_begins_here_and_progress_finishes_it")
def _():
    """No Python thread carries it: the engine's nonblocking call is begun on this thread (MPI's Iallreduce,
    torch's async_op), and progress() moves it to the end."""
    import time

    t = torch.full((1 << 16,), float(R + 1))
    handle = comm.allreduce_async(t, op="sum")
    assert comm._worker.idle(), "handed to the background thread"
    deadline = time.monotonic() + 30
    while comm.progress() and time.monotonic() < deadline:
        pass
    assert handle.is_completed() and comm.progress() == 0
    assert torch.equal(handle.wait(), torch.full((1 << 16,), float(sum(range(1, P + 1)))))


@case("a_large_allreduce_travels_in_pieces_one_at_a_time")
def _():
    """Over MPI an async allreduce larger than ALLREDUCE_PIECE_BYTES travels piece by piece, one in flight at a
    time (Open MPI's Iallreduce allocates a buffer as large as its message); the result is the same everywhere."""
    from gpurig.comm import mpi_engine

    saved, mpi_engine.ALLREDUCE_PIECE_BYTES = mpi_engine.ALLREDUCE_PIECE_BYTES, 4096
    try:
        for dtype in (torch.float32, torch.float16):
            n = 37 * 101  # 4 pieces of float32, 2 of float16, the last one short
            t = value(R, n, dtype).view(37, 101)
            assert torch.equal(comm.allreduce(t, op="sum"), total(n, dtype).view(37, 101))
            t = value(R, n, dtype).view(37, 101)
            handle = comm.allreduce_async(t, op="sum")
            while comm.progress():
                pass
            assert torch.equal(handle.wait(), total(n, dtype).view(37, 101)) and handle.is_completed()
        if comm.engine_name == "mpi":
            assert len(mpi_engine.allreduce_pieces(torch.zeros(n))) == 4
    finally:
        mpi_engine.ALLREDUCE_PIECE_BYTES = saved


@case("a_job_on_the_communication_thread_runs_a_known_allreduce_before_submit_says_it_is_queued")
def _():
    # submit() queues a job, then notes it (_last): a job started in between, whose blocking allreduce took the
    # short path of a signature seen before, waited on the lock its own thread held (bench hung so under load)
    t = torch.ones(5)
    comm.allreduce(t, op="sum", name="seen before")   # the short path knows it now

    def job():
        comm._worker._last = None                      # as in the window between queue.put and _last = future
        return comm.allreduce(torch.ones(5), op="sum", name="seen before")
    assert torch.equal(comm.run_async(job).wait(timeout=30), torch.full((5,), float(P)))


@case("allgather_bytes")
def _():
    got = comm.allgather_bytes(b"x" * R)
    assert got == [b"x" * r for r in range(P)]


@case("barrier_and_identity")
def _():
    comm.barrier()
    assert gpurig.rank() == R and gpurig.size() == P
    assert 0 <= comm.local_rank < comm.local_size <= P


write(R)
