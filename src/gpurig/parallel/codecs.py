"""Element-wise gradient codecs: how a float32 value is written in fewer bits.

A codec is a pair of functions over a payload — a tuple of tensors laid out by
``layout(n)``: ``encode(x, payload)`` writes the code of the float32 values
``x`` into it, ``decode(payload, out)`` writes the values back into ``out``.
Both work in place on buffers the caller owns, so the training loop allocates
nothing per step (on a CPU a fresh 10 MB temporary costs more in page faults
than the arithmetic). :func:`encode` and :func:`decode` are the allocating
conveniences. Lossy codecs are used with error feedback
(:func:`encode_with_feedback`): what the codec lost this step is added to next
step's gradient, so nothing is lost for good, only delayed.

- ``fp16`` / ``bf16``: 16 bits per value.
- ``int8``: blockwise absmax scaling, then 8-bit linear levels (-127..127).
- ``int8-dynamic``: blockwise absmax scaling, then Dettmers' 8-bit dynamic data
  type (ICLR 2016): a sign bit, an exponent in unary (leading zeros, then an
  indicator bit) and the remaining bits as a linear "binary tree" fraction in
  [0.1, 1] — fine steps near zero, coarse steps near one, 7 orders of magnitude.
  Each value goes to its nearest code (exactly, but for floats within two ulps
  of a midpoint), found by arithmetic on its decade (:func:`_dynamic_tables`).

Blockwise codecs need ``n`` to be a multiple of :data:`BLOCK`; the compressed
averaging pads its chunks to whole blocks (:func:`padded_length`).

The low-rank codec (PowerSGD) is not element-wise: it lives in
:mod:`gpurig.parallel.powersgd`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import torch

from gpurig.parallel import graphs, native
from gpurig.parallel.native import gpu

BLOCK = 1024  # values per absmax scale: 4 bytes of scale per KiB of int8 codes
EXPONENTS = 7  # decades the 8-bit dynamic type spans below each block's absmax

Payload = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Codec:
    """An element-wise gradient format.

    ``layout(n)`` lists the payload's tensors for n values as (dtype, length);
    ``encode(x, payload)`` and ``decode(payload, out)`` fill them in place.
    """

    name: str
    layout: Callable[[int], list[tuple[torch.dtype, int]]]
    encode: Callable[[torch.Tensor, Payload], None]
    decode: Callable[[Payload, torch.Tensor], None]
    bits_per_value: float
    lossy: bool = True
    blockwise: bool = False
    # Optional faster paths, same results up to rounding: ``encode_residual(x, residual, payload, add)`` adds
    # the residual to x (if ``add``), encodes, and writes what the encoding lost into ``residual``, in one go;
    # ``decode_add`` adds the decoded values to ``out`` without a temporary.
    encode_residual: Callable[[torch.Tensor, torch.Tensor, Payload, bool], None] | None = None
    decode_add: Callable[[Payload, torch.Tensor], None] | None = None


def padded_length(n: int, codec: Codec) -> int:
    """``n`` rounded up to what ``codec`` can encode (whole blocks for blockwise codecs).

    >>> padded_length(1500, get("int8")), padded_length(1500, get("fp16"))
    (2048, 1500)
    """
    return -(-n // BLOCK) * BLOCK if codec.blockwise else n


def payload_bytes(codec: Codec, n: int) -> int:
    """Bytes the payload of ``n`` values occupies on the wire.

    >>> payload_bytes(get("int8"), 2048), payload_bytes(get("fp16"), 10)
    (2056, 20)
    """
    return sum(length * torch.empty(0, dtype=dtype).element_size() for dtype, length in codec.layout(n))


def payload_views(codec: Codec, n: int, buffer: torch.Tensor) -> Payload:
    """The payload tensors of ``n`` values as views into the flat byte ``buffer`` (no copy).

    Packing every payload tensor into one byte row lets one collective carry it.

    >>> buf = torch.zeros(payload_bytes(get("int8"), 1024), dtype=torch.uint8)
    >>> [(t.dtype, t.numel()) for t in payload_views(get("int8"), 1024, buf)]
    [(torch.int8, 1024), (torch.float32, 1)]
    """
    views, start = [], 0
    for dtype, length in codec.layout(n):
        size = length * torch.empty(0, dtype=dtype).element_size()
        views.append(buffer[start: start + size].view(dtype))
        start += size
    return tuple(views)


def dynamic_map(exponent_bits: int = EXPONENTS) -> torch.Tensor:
    """The 256 values of the signed 8-bit dynamic data type, sorted, in [-1, 1].

    For exponent ``e`` (0 ≤ e < 7: e leading zero bits, then the indicator bit),
    the 6 − e bits left make 2^(6−e) fraction values: midpoints of equal bins in
    [0.1, 1], times 10^−e. That is 127 magnitudes from 5.5e-7 to 0.993; with
    both signs, zero and exactly 1.0 (the block's absmax), 256 codes. Each is
    computed as the encoder computes it (:func:`_dynamic_tables`), so a value's
    residual is exactly what decoding its code leaves.

    >>> m = dynamic_map()
    >>> len(m), m.max().item(), (m == 0).sum().item(), round(m[m > 0].min().item(), 9)
    (256, 1.0, 1, 5.5e-07)
    """
    magnitudes = _magnitudes(_dynamic_tables(exponent_bits), exponent_bits)
    return torch.cat([-magnitudes[1:-1].flip(0), magnitudes])


# The encoder's tables: one float32 array of eight-entry rows, indexed by a value's slot (0: the block's absmax,
# 1.0; 1-6: the decades [0.1, 1), [0.01, 0.1), ...; 7: the smallest decade's one code and zero), in the order the C
# kernel (parallel/native/int8.c) reads them.
_TH, _INVW, _C, _PLAST, _W, _G = 0, 8, 16, 24, 32, 40
_SLOTS = 8


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a × b + c rounded once to float32, as the kernel's fused multiply-add (float64 holds these sums exactly)."""
    return (a.double() * b.double() + c.double()).float()


def _magnitudes(t: torch.Tensor, exponent_bits: int = EXPONENTS) -> torch.Tensor:
    """The 129 magnitudes (zero, the 127 fractions, 1.0), each ``position × W + G`` in its slot."""
    positions = torch.arange(2 ** exponent_bits + 1, dtype=torch.float32)
    return _fma(positions, t[_W + _slot_of(positions)], t[_G + _slot_of(positions)])


def _slot_of(positions: torch.Tensor) -> torch.Tensor:
    """The slot of each position among the 129 magnitudes: 0 for 1.0, 7 for zero and the smallest code."""
    decade = EXPONENTS - 1 - torch.log2(positions.clamp(1, 2 ** (EXPONENTS - 1))).floor().long()  # [N, 2N): 6 − log2 N
    return torch.where(positions == 2 ** EXPONENTS, 0, torch.where(positions <= 1, _SLOTS - 1, decade + 1))


def _dynamic_tables(exponent_bits: int = EXPONENTS) -> torch.Tensor:
    """What the encoder looks up per slot, and why it finds each value's nearest code.

    A decade's codes are the midpoints of its equal bins: decade e (slot e + 1) has
    N = 2^(6−e) bins of width W from 10^−(e+1), at positions N..2N−1 among the 129
    magnitudes. So the position of a normalised magnitude a in it is
    ``floor(a / W + C)`` with C = N − N/9, its code ``position × W + G``. A slot
    holds the values whose nearest code is one of its own: from the midpoint
    below its smallest code (``TH``) to the one above its largest. The decade
    above begins a fifth of a bin past the top bin's edge, so the position is
    clipped to the top bin (``PLAST``). Slot 0 holds only 1.0 (INVW = 0: every
    value there is position 128, 128 × 1 − 127); slot 7 holds zero and 5.5e-7, the smallest
    decade's one code, as two bins of width 5.5e-7 starting at −2.75e-7.

    >>> t = _dynamic_tables()
    >>> [int(t[_PLAST + s]) for s in range(8)], round(t[_TH + 1].item(), 5)
    ([128, 127, 63, 31, 15, 7, 3, 1], 0.10281)
    """
    t = torch.zeros(6 * _SLOTS, dtype=torch.float64)
    t[_C], t[_PLAST], t[_W], t[_G] = 2 ** exponent_bits, 2 ** exponent_bits, 1.0, 1.0 - 2 ** exponent_bits
    for e in range(exponent_bits - 1):
        s, bins, top = e + 1, 2 ** (exponent_bits - 1 - e), 10.0 ** -e
        width = 0.9 * top / bins
        t[_INVW + s], t[_C + s], t[_PLAST + s] = 1 / width, bins - bins / 9, 2 * bins - 1
        t[_W + s], t[_G + s] = width, top / 10 + (0.5 - bins) * width
    smallest = 0.55 * 10.0 ** -(exponent_bits - 1)  # the midpoint of [1e-7, 1e-6]
    t[_INVW + _SLOTS - 1], t[_C + _SLOTS - 1], t[_PLAST + _SLOTS - 1] = 1 / smallest, 0.5, 1
    t[_W + _SLOTS - 1] = smallest
    t = t.float()
    magnitudes = _magnitudes(t, exponent_bits)
    for s in range(_SLOTS - 1):  # the float32 midpoint below each slot's smallest code
        lowest = 2 ** exponent_bits if s == 0 else 2 ** (exponent_bits - s)
        t[_TH + s] = (magnitudes[lowest] + magnitudes[lowest - 1]) * 0.5
    t[_TH + _SLOTS - 1] = -1.0  # nothing is below slot 7
    return t


_SCRATCH = threading.local()


def _scratch(like: torch.Tensor) -> torch.Tensor:
    """A float32 buffer shaped like ``like``, kept per thread and reused across calls."""
    cache = _SCRATCH.__dict__.setdefault("buffers", {})
    key = (like.numel(), like.device)
    if key not in cache:
        if len(cache) >= 16:  # one size per bucket is the common case; don't hoard memory beyond that
            cache.clear()
            graphs.clear()  # CUDA graphs captured with the old buffers must not write into them again
        cache[key] = torch.empty(like.numel(), dtype=torch.float32, device=like.device)
    return cache[key].view(like.shape)


def _blockwise_layout(code_dtype):
    return lambda n: [(code_dtype, n), (torch.float32, n // BLOCK)]


_SMALLEST_SCALE = 127 * torch.finfo(torch.float32).tiny  # so 127 / scale stays finite for an all-zero block


def _absmax(blocks: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Largest magnitude of each row, into ``out``; max and −min avoid an abs() temporary."""
    torch.amax(blocks, dim=1, out=out)
    out.clamp_min_(_SMALLEST_SCALE)
    return torch.maximum(out, blocks.amin(dim=1).neg_(), out=out)


_CONSTANTS: dict = {}


def _constant(value: float, like: torch.Tensor) -> torch.Tensor:
    """``value`` as a 0-d tensor on ``like``'s device, made once: ``new_tensor`` copies from pageable host memory
    each call, and on a GPU that copy waits for everything queued before it (a synchronisation per encode)."""
    key = (value, like.device, like.dtype)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.tensor(value, dtype=like.dtype, device=like.device)
    return _CONSTANTS[key]


def _int8_levels(x: torch.Tensor, payload: Payload) -> torch.Tensor:
    """Write the codes of ``x``; return them as float levels (a per-thread scratch buffer)."""
    codes, scale = payload
    blocks = x.view(-1, BLOCK)
    _absmax(blocks, scale)
    # 127 / scale as a true division, as the C kernel computes it (torch's ``127 / tensor`` is reciprocal × 127,
    # which differs in the last bit and moves a value on a rounding boundary to the next code)
    levels = torch.mul(blocks, torch.div(_constant(127.0, scale), scale)[:, None], out=_scratch(blocks)).round_()
    codes.view(-1, BLOCK).copy_(levels)
    return levels


def _encode_int8(x: torch.Tensor, payload: Payload) -> None:
    _int8_levels(x, payload)


def _native(*tensors: torch.Tensor):
    """The C kernels (:mod:`gpurig.parallel.native`) when every tensor is contiguous host memory, else None."""
    if all(t.device.type == "cpu" and t.is_contiguous() for t in tensors):
        return native.library()
    return None


def _gpu_kernels(*tensors: torch.Tensor):
    """The Triton kernels (:mod:`gpurig.parallel.native.gpu`) when every tensor is contiguous GPU memory and
    Triton is installed, else None."""
    if all(t.is_cuda and t.is_contiguous() for t in tensors):
        return gpu.kernels()
    return None


def _encode_int8_residual(x: torch.Tensor, residual: torch.Tensor, payload: Payload, add: bool) -> None:
    codes, scale = payload
    lib = _native(x, residual, codes, scale)
    if lib is not None:
        lib.int8_encode_feedback(x.data_ptr(), residual.data_ptr(), int(add), codes.data_ptr(), scale.data_ptr(),
                                 x.numel(), BLOCK, _SMALLEST_SCALE)
        return
    kernels = _gpu_kernels(x, residual, codes, scale)
    if kernels is not None:
        kernels.int8_encode_feedback(x, residual, add, codes, scale, x.numel(), BLOCK, _SMALLEST_SCALE)
        return
    if add:
        x.add_(residual)
    # x − levels·scale/127 from the float levels still at hand: one pass, not decode-then-subtract's three
    levels = _int8_levels(x, payload)
    torch.addcmul(x.view(-1, BLOCK), levels, (scale / -127)[:, None], out=residual.view(-1, BLOCK))


def _decode_add_int8(payload: Payload, out: torch.Tensor) -> None:
    codes, scale = payload
    out.view(-1, BLOCK).addcmul_(codes.view(-1, BLOCK), (scale / 127)[:, None])


def _decode_int8(payload: Payload, out: torch.Tensor) -> None:
    codes, scale = payload
    lib = _native(codes, scale, out)
    if lib is not None:
        lib.int8_decode(codes.data_ptr(), scale.data_ptr(), out.data_ptr(), out.numel(), BLOCK)
        return
    out.copy_(codes)
    out.view(-1, BLOCK).mul_((scale / 127)[:, None])


_MAP: dict = {}


def _map(device: torch.device) -> torch.Tensor:
    if device not in _MAP:
        _MAP[device] = dynamic_map().to(device)
    return _MAP[device]


_TABLES: dict = {}


def _tables(device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The encoder's tables on ``device`` (float64: the same values, for :func:`_fma`'s sums without a cast)."""
    if (device, dtype) not in _TABLES:
        _TABLES[device, dtype] = _dynamic_tables().to(device=device, dtype=dtype)
    return _TABLES[device, dtype]


def _encode_dynamic(x: torch.Tensor, payload: Payload) -> None:
    """Each value's nearest code by its slot's arithmetic (:func:`_dynamic_tables`): the C kernel's steps."""
    codes, scale = payload
    blocks = x.view(-1, BLOCK)
    _absmax(blocks, scale)
    t = _tables(x.device)
    inv = torch.div(_constant(1.0, scale), scale)  # a true division then a multiply, as the C kernel
    a = torch.abs(blocks, out=_scratch(blocks)).mul_(inv[:, None]).view(-1)
    negative = torch.signbit(x)
    bound = torch.where(negative, t[_TH], 1.0)  # the type has no -1.0
    a = torch.where(a < bound, a, bound)  # a NaN becomes the bound, as the kernel's vector min makes it
    s = _SLOTS - 1 - torch.bucketize(a, t[_TH: _TH + _SLOTS - 1].flip(0), right=False)
    wide = _tables(x.device, torch.float64)
    position = torch.minimum(torch.floor(_fma(a, wide[_INVW + s], wide[_C + s])), t[_PLAST + s])
    codes.copy_(torch.where(negative, 127 - position, 127 + position))


def _decode_dynamic(payload: Payload, out: torch.Tensor) -> None:
    codes, scale = payload
    lib = _native(codes, scale, out)
    if lib is not None:
        lib.dynamic_decode(codes.data_ptr(), scale.data_ptr(), out.data_ptr(), out.numel(), BLOCK,
                           _map(out.device).data_ptr(), _tables(out.device).data_ptr())
        return
    torch.index_select(_map(out.device), 0, codes.int(), out=out)
    out.view(-1, BLOCK).mul_(scale[:, None])


def _encode_dynamic_residual(x: torch.Tensor, residual: torch.Tensor, payload: Payload, add: bool) -> None:
    codes, scale = payload
    lib = _native(x, residual, codes, scale)
    if lib is not None:
        lib.dynamic_encode_feedback(x.data_ptr(), residual.data_ptr(), int(add), codes.data_ptr(), scale.data_ptr(),
                                    x.numel(), BLOCK, _SMALLEST_SCALE, _tables(x.device).data_ptr())
        return
    kernels = _gpu_kernels(x, residual, codes, scale)
    if kernels is not None:
        kernels.dynamic_encode_feedback(x, residual, add, codes, scale, x.numel(), BLOCK, _SMALLEST_SCALE,
                                        _tables(x.device))
        return
    if add:
        x.add_(residual)
    _encode_then_subtract(_encode_dynamic, _decode_dynamic, x, residual, payload)


def _cast_encode(x: torch.Tensor, payload: Payload) -> None:
    payload[0].copy_(x)  # the payload's dtype is the cast


def _cast_decode(payload: Payload, out: torch.Tensor) -> None:
    out.copy_(payload[0])


def _cast_residual(kernel: str):
    """Encode-with-feedback for a 16-bit cast: the C kernel in one pass where there is one, else torch's four."""
    def encode_residual(x: torch.Tensor, residual: torch.Tensor, payload: Payload, add: bool) -> None:
        lib = _native(x, residual, payload[0])
        if lib is not None and hasattr(lib, kernel):
            getattr(lib, kernel)(x.data_ptr(), residual.data_ptr(), int(add), payload[0].data_ptr(), x.numel())
            return
        if add:
            x.add_(residual)
        _encode_then_subtract(_cast_encode, _cast_decode, x, residual, payload)

    return encode_residual


CODECS: dict[str, Codec] = {
    "none": Codec("none", lambda n: [(torch.float32, n)], _cast_encode, _cast_decode, 32.0, lossy=False),
    "fp16": Codec("fp16", lambda n: [(torch.float16, n)], _cast_encode, _cast_decode, 16.0,
                  encode_residual=_cast_residual("fp16_encode_feedback")),
    "bf16": Codec("bf16", lambda n: [(torch.bfloat16, n)], _cast_encode, _cast_decode, 16.0,
                  encode_residual=_cast_residual("bf16_encode_feedback")),
    "int8": Codec("int8", _blockwise_layout(torch.int8), _encode_int8, _decode_int8, 8 + 32 / BLOCK,
                  blockwise=True, encode_residual=_encode_int8_residual, decode_add=_decode_add_int8),
    "int8-dynamic": Codec("int8-dynamic", _blockwise_layout(torch.uint8), _encode_dynamic, _decode_dynamic,
                          8 + 32 / BLOCK, blockwise=True, encode_residual=_encode_dynamic_residual),
}


def get(name: str) -> Codec:
    """An element-wise codec by name.

    >>> get("int8").bits_per_value
    8.03125
    """
    if name not in CODECS:
        raise ValueError(f"unknown codec {name!r}; choose one of: {', '.join(CODECS)}")
    return CODECS[name]


def empty_payload(codec: Codec, n: int, device=None) -> Payload:
    """Freshly allocated payload tensors for ``n`` values."""
    return tuple(torch.empty(length, dtype=dtype, device=device) for dtype, length in codec.layout(n))


def encode(codec: Codec, x: torch.Tensor) -> Payload:
    """Encode ``x`` (any length) into a new payload; padding to whole blocks is added as zeros.

    >>> [t.shape for t in encode(get("int8"), torch.randn(1500))]
    [torch.Size([2048]), torch.Size([2])]
    """
    n = padded_length(x.numel(), codec)
    if n != x.numel():
        x = torch.cat([x.reshape(-1), x.new_zeros(n - x.numel())])
    payload = empty_payload(codec, n, x.device)
    codec.encode(x.reshape(-1).float(), payload)
    return payload


def decode(codec: Codec, payload: Payload, n: int) -> torch.Tensor:
    """The first ``n`` values a payload made by :func:`encode` stands for.

    >>> x = torch.tensor([0.5, -1.0, 0.25])
    >>> decode(get("fp16"), encode(get("fp16"), x), 3)
    tensor([ 0.5000, -1.0000,  0.2500])
    """
    out = torch.empty(payload[0].numel(), dtype=torch.float32, device=payload[0].device)
    codec.decode(payload, out)
    return out[:n]


def encode_with_feedback(codec: Codec, x: torch.Tensor, residual: torch.Tensor | None,
                         payload: Payload) -> torch.Tensor | None:
    """Encode ``x`` plus last step's ``residual`` into ``payload``; return the new residual.

    The new residual is what this encoding lost; adding it back next step makes
    the sum of decoded values track the sum of true values (EF-SGD, 1-bit SGD).
    ``x`` is overwritten (it becomes the corrected value), and ``residual``'s
    buffer is reused for the new one, so nothing is allocated.

    >>> x = torch.randn(2048); payload = empty_payload(get("int8"), 2048)
    >>> residual = encode_with_feedback(get("int8"), x.clone(), None, payload)
    >>> torch.allclose(decode(get("int8"), payload, 2048) + residual, x)
    True
    """
    if codec.encode_residual is not None:
        add = residual is not None
        residual = residual if add else torch.empty_like(x)
        graphs.run(codec.encode_residual, x, residual, payload, add)
        return residual
    if residual is not None:
        x.add_(residual)
    if not codec.lossy:
        codec.encode(x, payload)
        return None
    if residual is None:
        residual = torch.empty_like(x)
    return _encode_then_subtract(codec.encode, codec.decode, x, residual, payload)


def _encode_then_subtract(encode, decode, x: torch.Tensor, residual: torch.Tensor, payload: Payload) -> torch.Tensor:
    """Encode ``x``; write what the encoding lost into ``residual`` (the plain way: decode, then subtract)."""
    encode(x, payload)
    decode(payload, residual)
    return torch.sub(x, residual, out=residual)


def decode_into(codec: Codec, payload: Payload, out: torch.Tensor) -> None:
    """Write the values ``payload`` stands for into ``out`` (on a GPU, a replayed graph from the second call on
    with the same buffers: :mod:`gpurig.parallel.graphs`).

    >>> out = torch.empty(1024); decode_into(get("int8"), encode(get("int8"), torch.ones(1024)), out)
    >>> out.unique().tolist()
    [1.0]
    """
    graphs.run(codec.decode, payload, out)


def decode_add(codec: Codec, payload: Payload, out: torch.Tensor, scratch: torch.Tensor) -> None:
    """Add the values ``payload`` stands for to ``out``; ``scratch`` (same length) is used only if the codec
    has no fused way.

    >>> x = torch.randn(1024); out = torch.ones(1024)
    >>> decode_add(get("int8"), encode(get("int8"), x), out, torch.empty(1024))
    >>> torch.allclose(out, 1 + decode(get("int8"), encode(get("int8"), x), 1024), atol=1e-6)
    True
    """
    if codec.decode_add is not None:
        graphs.run(codec.decode_add, payload, out)
    else:
        codec.decode(payload, scratch)
        out.add_(scratch)


def cost_seconds(codec: Codec, n: int, ranks: int, device=None) -> float:
    """Seconds of arithmetic :func:`~gpurig.parallel.compression.compressed_average` spends on ``n`` values here.

    Each rank encodes with error feedback what it sends and what it owns (n
    values in all) and decodes what it receives ((P−1)/P·n) and gathers (n):
    both timed on random values of this size on ``device``.

    >>> cost_seconds(get("fp16"), 4096, ranks=2) > 0
    True
    """
    from gpurig.timing import device_sync, timed

    n = padded_length(n, codec)
    x, residual = torch.randn(n, device=device), torch.zeros(n, device=device)
    payload, out = empty_payload(codec, n, device), torch.empty(n, device=device)
    sync = device_sync(out.device)
    return (timed(lambda: encode_with_feedback(codec, x, residual, payload), sync=sync)
            + timed(lambda: decode_into(codec, payload, out), sync=sync) * (2 - 1 / ranks))
