"""The Triton kernels behind :mod:`gpurig.parallel.native.gpu` (imported only where Triton is installed)."""

import triton
import triton.language as tl

# the dynamic type's table rows (gpurig.parallel.codecs._dynamic_tables)
TH, INVW, C, PLAST, W, G, SLOTS = (tl.constexpr(v) for v in (0, 8, 16, 24, 32, 40, 8))
# adding then subtracting 1.5 · 2^23 rounds a float32 of magnitude below 2^22 to the nearest integer, ties to even
# (as torch.round and nearbyintf; the kernels are built without fusing multiply-adds, so nothing merges the two)
ROUNDER = tl.constexpr(12582912.0)


@triton.jit
def _corrected_block(x_ptr, r_ptr, offsets, add: tl.constexpr, smallest):
    """The block plus its residual (written back into x), and its absmax as the C kernel takes it: the largest
    |x| compared as bits, so NaN (above infinity) and infinity become the scale; at least ``smallest``."""
    x = tl.load(x_ptr + offsets)
    if add:
        x = x + tl.load(r_ptr + offsets)
        tl.store(x_ptr + offsets, x)
    most = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=0)
    m = most.to(tl.float32, bitcast=True)
    return x, tl.where(m < smallest, smallest, m)


@triton.jit
def _int8_kernel(x_ptr, r_ptr, codes_ptr, scale_ptr, smallest, add: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    offsets = b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x, m = _corrected_block(x_ptr, r_ptr, offsets, add, smallest)
    tl.store(scale_ptr + b, m)
    level = (x * tl.div_rn(127.0, m) + ROUNDER) - ROUNDER
    tl.store(codes_ptr + offsets, level.to(tl.int8))
    # x − level · (scale / 127), as torch's addcmul with the step's negative computes it
    tl.store(r_ptr + offsets, tl.fma(level, -tl.div_rn(m, 127.0), x))


@triton.jit
def _dynamic_kernel(x_ptr, r_ptr, codes_ptr, scale_ptr, t_ptr, smallest, add: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    offsets = b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x, m = _corrected_block(x_ptr, r_ptr, offsets, add, smallest)
    tl.store(scale_ptr + b, m)
    negative = x.to(tl.int32, bitcast=True) < 0
    a = tl.abs(x) * tl.div_rn(1.0, m)
    bound = tl.where(negative, tl.load(t_ptr + TH), 1.0)  # the type has no -1.0
    a = tl.where(a < bound, a, bound)  # a NaN becomes the bound
    s = tl.zeros([BLOCK], dtype=tl.int32)
    for k in tl.static_range(SLOTS - 1):
        s += (a <= tl.load(t_ptr + TH + k)).to(tl.int32)
    position = tl.floor(tl.fma(a, tl.load(t_ptr + INVW + s), tl.load(t_ptr + C + s)))
    position = tl.minimum(position, tl.load(t_ptr + PLAST + s))
    magnitude = tl.fma(position, tl.load(t_ptr + W + s), tl.load(t_ptr + G + s))
    p = position.to(tl.int32)
    tl.store(codes_ptr + offsets, tl.where(negative, 127 - p, 127 + p).to(tl.uint8))
    # x − decoded, the decoded value rounded first (the map's magnitude times the scale), as the torch encoder
    decoded = tl.where(negative, -magnitude, magnitude) * m
    tl.store(r_ptr + offsets, x - decoded)


def int8_encode_feedback(x, residual, add, codes, scale, n, block, smallest):
    _int8_kernel[(n // block,)](x, residual, codes, scale, smallest, add=bool(add), BLOCK=block,
                                enable_fp_fusion=False)


def dynamic_encode_feedback(x, residual, add, codes, scale, n, block, smallest, tables):
    _dynamic_kernel[(n // block,)](x, residual, codes, scale, tables, smallest, add=bool(add), BLOCK=block,
                                   enable_fp_fusion=False)
