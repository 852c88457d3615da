"""Encode + decode throughput of each gradient codec on this CPU, as a fraction of memcpy bandwidth.

One thread (what each rank gets on a 2-core machine with 2 ranks), the source's
MLP gradient (2.4 M float32 values, 9.6 MB), best of several repetitions,
buffers allocated once (as the training loop does). Encoding is what training
does: with error feedback (add last step's residual, encode, keep what was
lost); int8 uses the C kernels where this machine can build them. On a GPU
(``--device cuda``) each codec is timed as training runs it, its kernels
replayed as a CUDA graph (:mod:`gpurig.parallel.graphs`), and again eagerly
(``eager_*_ms``: one kernel at a time from Python). PowerSGD (rank 4) is timed
on the MLP's own layer shapes: encoding is P = M·Q, orthonormalising P and
Q = Mᵀ·P; decoding is P·Qᵀ.

    OMP_NUM_THREADS=1 python benchmarks/codec_throughput.py --out /tmp/codecs.json
"""

import argparse
import json

import torch

from gpurig import models
from gpurig.parallel import codecs, graphs, native, powersgd
from gpurig.timing import device_sync, timed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--device", default="cpu", help="cpu (one thread) or cuda")
    args = p.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    shapes = [q.shape for q in models.mlp().parameters()]
    values = sum(s.numel() for s in shapes)
    n = codecs.padded_length(values, codecs.get("int8"))
    x = torch.randn(n, device=device)
    out = torch.empty_like(x)
    nbytes = values * 4

    def best(fn):
        return timed(fn, args.repeats, sync=device_sync(device))

    memcpy = nbytes / best(lambda: out.copy_(x))
    rows = {}
    for name, codec in codecs.CODECS.items():
        payload = codecs.empty_payload(codec, n, device)
        residual = torch.zeros_like(x) if codec.lossy else None
        encode = best(lambda: codecs.encode_with_feedback(codec, x, residual, payload))
        decode = best(lambda: codecs.decode_into(codec, payload, out))
        rows[name] = {"encode_ms": 1000 * encode, "decode_ms": 1000 * decode,
                      "gb_per_s": nbytes / (encode + decode) / 1e9,
                      "fraction_of_memcpy": nbytes / (encode + decode) / memcpy,
                      "wire_bytes": codecs.payload_bytes(codec, n)}
        if device.type == "cuda":  # the same kernels dispatched one by one from Python, as before CUDA graphs
            with graphs.eager():
                rows[name]["eager_encode_ms"] = 1000 * best(
                    lambda: codecs.encode_with_feedback(codec, x, residual, payload))
                rows[name]["eager_decode_ms"] = 1000 * best(lambda: codecs.decode_into(codec, payload, out))

    rank = powersgd.DEFAULT_RANK
    matrices, _ = powersgd.split(shapes, rank)
    work = [(torch.randn(rows_, cols, device=device), torch.randn(rank, cols, device=device))
            for _, rows_, cols in matrices]
    factors = []

    def lowrank_encode():  # as powersgd.LowRankAverage computes them: P = M·Q, then Qᵀ = P̂ᵀ·M
        factors.clear()
        for m, q_t in work:
            p_hat = powersgd.orthonormalize(m @ q_t.T)
            factors.append((p_hat, p_hat.T @ m))

    lowrank_encode()
    decoded = [torch.empty_like(m) for m, _ in work]

    def lowrank_decode():
        for (p_hat, q_t), target in zip(factors, decoded):
            torch.matmul(p_hat, q_t, out=target)

    encode = best(lowrank_encode)
    decode = best(lowrank_decode)
    rows[f"powersgd (rank {rank})"] = {
        "encode_ms": 1000 * encode, "decode_ms": 1000 * decode, "gb_per_s": nbytes / (encode + decode) / 1e9,
        "fraction_of_memcpy": nbytes / (encode + decode) / memcpy,
        "wire_bytes": 4 * powersgd.factor_values(shapes, rank)}
    with open(args.out, "w") as f:
        json.dump({"values": values, "device": str(device), "memcpy_gb_per_s": memcpy / 1e9,
                   "native_kernels": device.type == "cpu" and native.library() is not None, "codecs": rows}, f, indent=2)


if __name__ == "__main__":
    main()
