"""Encode + decode throughput of each gradient codec on this CPU, as a fraction of memcpy bandwidth.

One thread (what each rank gets on a 2-core machine with 2 ranks), the source's
MLP gradient (2.4 M float32 values, 9.6 MB), best of several repetitions.

    OMP_NUM_THREADS=1 python benchmarks/codec_throughput.py --out /tmp/codecs.json
"""

import argparse
import json
import time

import torch

from gpurig.parallel import codecs


def best_seconds(fn, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--values", type=int, default=2_395_210)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(args.values)
    out = torch.empty_like(x)
    nbytes = x.numel() * 4
    memcpy = nbytes / best_seconds(lambda: out.copy_(x))
    rows = {}
    for name, codec in codecs.CODECS.items():
        payload = codec.encode(x)
        encode = best_seconds(lambda: codec.encode(x))
        decode = best_seconds(lambda: codec.decode(payload, x.numel()))
        rate = nbytes / (encode + decode)
        rows[name] = {"encode_ms": 1000 * encode, "decode_ms": 1000 * decode, "gb_per_s": rate / 1e9,
                      "fraction_of_memcpy": rate / memcpy,
                      "wire_bytes": sum(t.numel() * t.element_size() for t in payload)}
    with open(args.out, "w") as f:
        json.dump({"values": args.values, "memcpy_gb_per_s": memcpy / 1e9, "codecs": rows}, f, indent=2)


if __name__ == "__main__":
    main()
