"""Where a small compressed average's time goes: the whole chain against its codec arithmetic and a plain allreduce.

    gpurig run -n 2 -- python benchmarks/codec_chain.py --out /tmp/codec_chain.json

`gpurig bench` reports a compressed average of 256 KB at 1.3-2.2 ms on this CPU
machine and 1.5-5.6 ms on a lent H100 (CUDA tensors, MPI that is not CUDA-aware),
where an allreduce of the same bytes takes under 0.1 ms. For each method and
size, side by side in one job, interleaved rounds, the slowest rank's median:

- ``chain``: DataParallel's compressed average of one bucket
  (:func:`gpurig.parallel.compression.average`) on the caller's thread;
- ``async``: the same handed to the communication thread (``run_async``, as
  `bench` times it);
- ``codec``: the codec's own arithmetic on this rank for that bucket (encode with
  error feedback of the chunks it sends, decode-add of what it receives, encode of
  its average, decode of everybody's), no communication;
- ``allreduce``: the uncompressed allreduce of the same float32 bucket.

``chain − codec − allreduce`` is then what the averaging adds around them: its
pieces' collectives, their bookkeeping and, for CUDA tensors through an MPI that
is not CUDA-aware, staging to host memory.
"""

import argparse

import torch

import gpurig
from gpurig.parallel import codecs
from gpurig.parallel.compression import FeedbackState, average, chunk_length, collectives
from gpurig.measure.comm import square_ish
from gpurig.timing import device_sync
from common import interleave, median, slowest_rank, write_result

METHODS = ("fp16", "int8", "int8-dynamic")
VALUES = (1 << 16, 1 << 18)


def codec_only(codec: codecs.Codec, n: int, ranks: int, device) -> callable:
    """A rank's codec arithmetic for one bucket of ``n`` values averaged over ``ranks`` (no communication)."""
    chunk = chunk_length(n, ranks, codec)
    x, residual, out = (torch.randn(chunk, device=device) for _ in range(3))
    payload = codecs.empty_payload(codec, chunk, device)
    scratch = torch.empty(chunk, device=device)

    def run():
        for _ in range(ranks - 1):  # the chunks sent, then the pieces received
            codecs.encode_with_feedback(codec, x, residual, payload)
        for _ in range(ranks - 1):
            codecs.decode_add(codec, payload, out, scratch)
        codecs.encode_with_feedback(codec, out, residual, payload)  # this rank's average
        for _ in range(ranks):
            codecs.decode_into(codec, payload, x)
    return run


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=10, help="calls per block")
    args = p.parse_args()
    comm = gpurig.init()
    sync = device_sync(comm.device)
    rows = []
    for method in METHODS:
        for values in VALUES:
            shapes = square_ish(values)
            x = torch.randn(values, device=comm.device)
            state = FeedbackState()
            announced = sum(collectives(values, comm.size, method, shapes=shapes), [])
            plain = torch.randn(values, device=comm.device)
            arithmetic = codec_only(codecs.get(method), values, comm.size, comm.device)

            def chain():
                comm.expect(announced)
                average(comm, x, method, state, shapes)
                sync()

            def handed():
                comm.expect(announced)
                comm.run_async(lambda: average(comm, x, method, state, shapes)).wait()
                sync()

            def codec():
                arithmetic()
                sync()

            def allreduce():
                comm.allreduce(plain)
                sync()

            blocks = {name: (lambda f=f: [f() for _ in range(args.calls)])
                      for name, f in (("chain", chain), ("async", handed), ("codec", codec), ("allreduce", allreduce))}
            seconds = interleave(blocks, args.rounds, warmup=2)
            row = {"method": method, "kb": values * 4 // 1024}
            for name, times in seconds.items():
                row[f"{name}_us"] = 1e6 * median(slowest_rank(comm, times)) / args.calls
            row["around_us"] = row["chain_us"] - row["codec_us"] - row["allreduce_us"]
            rows.append(row)
            if comm.rank == 0:
                print(f"{method:>13} {row['kb']:>5} KB  chain {row['chain_us']:7.0f} µs  async {row['async_us']:7.0f}"
                      f"  codec {row['codec_us']:6.0f}  allreduce {row['allreduce_us']:6.0f}  around {row['around_us']:6.0f}",
                      flush=True)
    write_result(comm, args.out, {"device": str(comm.device), "engine": type(comm.engine).__name__, "ranks": comm.size,
                                  "rows": rows})


if __name__ == "__main__":
    main()
