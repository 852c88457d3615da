"""A machine profile measured from inside a running job: what ``gpurig train`` predicts itself with.

The same micro-benchmarks as ``gpurig bench`` (:mod:`gpurig.measure.compute`,
:mod:`gpurig.measure.comm`), quick sizes, run by every rank of the job before
training starts: so the compute is measured with exactly the neighbours the
training will have, and the links are the job's own. About 10 s on 2 CPU ranks of a
2-core machine (most of it the GEMM grid and the overlap measurement).
"""

from __future__ import annotations

import datetime
import platform

import torch

ALLREDUCE_SIZES = (4 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20)  # up to a gradient bucket's size


def job_profile(comm, compressed: tuple[str, ...] = ()) -> dict:
    """A ``gpurig-profile/1`` dict for this job (every rank calls it; all get the same profile).

    ``compressed`` names the compression methods whose whole compressed
    average is timed too (as ``gpurig bench`` does), so the prediction prices a
    compressed bucket from its own chain rather than from the codec's arithmetic
    and the bytes apart.

    >>> profile = job_profile(gpurig.init(), compressed=("int8",))   # doctest: +SKIP
    >>> sorted(profile["comm"]["engines"]["mpi"])                     # doctest: +SKIP
    ['allreduce', 'compressed:int8']
    """
    from gpurig.measure.profile import SCHEMA, summarize_engine, summarize_overlap
    from gpurig.measure.comm import (COMPRESSED_VALUES, iterations, measure_collective, measure_compressed,
                                     measure_overlap)
    from gpurig.measure.compute import measure_all

    compute = measure_all(comm, quick=True)
    rows = []
    if comm.size > 1:
        for nbytes in ALLREDUCE_SIZES:
            # 16 MB per size: ~1 s in all at 1 Gbit/s, still seconds behind a 100 Mbit/s link
            n = iterations(nbytes, 16 << 20, 3, 30)
            rows.append(measure_collective(comm, "allreduce", nbytes, n, warmup=1))
        for method in compressed:
            # bench's middle sizes, 256 K and 1 M values: a bucket's size (no posting line: one size is in its
            # range, and a line needs two; predict charges the plain posting then)
            rows += [measure_compressed(comm, method, values, n=3, warmup=1, posting=False)
                     for values in COMPRESSED_VALUES[1:3]]
        overlap = measure_overlap(comm, 1 << 20, rounds=3)
    # Hostnames tell nodes apart; the kernel's boot id tells machines apart (emulated nodes are network
    # namespaces of one machine and share its cores, which is what the compute measurements saw).
    nodes = len(set(comm.allgather_bytes(platform.node().encode())))
    machines = comm.allgather_bytes(_boot_id().encode())
    per_machine = machines.count(machines[comm.rank])
    device = comm.device
    return {
        "schema": SCHEMA, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "cpu": platform.processor() or "cpu",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "quick": True, "measured_by": "gpurig train (in the job, before training)",
        "compute": {str(per_machine): compute},
        "comm": {"ranks": comm.size, "nodes": nodes, "ranks_per_machine": per_machine,
                 "engines": {comm.engine_name: summarize_engine(rows)},
                 "overlap": {comm.engine_name: summarize_overlap([overlap])}}
        if rows else None,
    }


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return platform.node()
