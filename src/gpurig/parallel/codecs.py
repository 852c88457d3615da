"""Gradient codecs: a pair of pure functions (encode, decode) per format.

``encode(x)`` turns a flat float32 tensor into a tuple of tensors (the payload
that travels); ``decode(payload, n)`` turns it back into n float32 values. Lossy
codecs are used with error feedback (:func:`with_error_feedback`): what the
codec lost this step is added to next step's gradient, so nothing is lost for
good, only delayed.

- ``fp16`` / ``bf16``: 16 bits per value.
- ``int8``: blockwise absmax scaling, then 8-bit linear levels (-127..127).
- ``int8-dynamic``: blockwise absmax scaling, then Dettmers' 8-bit dynamic data
  type (ICLR 2016): a sign bit, an exponent in unary (leading zeros, then an
  indicator bit) and the remaining bits as a linear "binary tree" fraction in
  [0.1, 1] — fine steps near zero, coarse steps near one, 7 orders of magnitude.
  Each value goes to its nearest code (exactly, up to 2^-12 relative).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

BLOCK = 1024  # values per absmax scale: 4 bytes of scale per KiB of int8 codes
EXPONENTS = 7  # decades the 8-bit dynamic type spans below each block's absmax


@dataclass(frozen=True)
class Codec:
    """A gradient format: how to encode, how to decode, and roughly how many bits a value costs."""

    name: str
    encode: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
    decode: Callable[[tuple[torch.Tensor, ...], int], torch.Tensor]
    bits_per_value: float
    lossy: bool = True


def dynamic_map(exponent_bits: int = EXPONENTS) -> torch.Tensor:
    """The 256 values of the signed 8-bit dynamic data type, sorted, in [-1, 1].

    For exponent ``e`` (0 ≤ e < 7: e leading zero bits, then the indicator bit),
    the 6 − e bits left make 2^(6−e) fraction values: midpoints of equal bins in
    [0.1, 1], times 10^−e. That is 127 magnitudes from 5.5e-7 to 0.993; with
    both signs, zero and exactly 1.0 (the block's absmax), 256 codes.

    >>> m = dynamic_map()
    >>> len(m), m.max().item(), (m == 0).sum().item(), round(m[m > 0].min().item(), 9)
    (256, 1.0, 1, 5.5e-07)
    """
    magnitudes = []
    for e in range(exponent_bits):
        edges = torch.linspace(0.1, 1.0, 2 ** (exponent_bits - 1 - e) + 1, dtype=torch.float64)
        magnitudes.append((edges[:-1] + edges[1:]) / 2 * 10.0 ** (-e))
    magnitudes = torch.cat(magnitudes)
    values = torch.cat([-magnitudes, torch.zeros(1, dtype=torch.float64), magnitudes, torch.ones(1, dtype=torch.float64)])
    return torch.sort(values).values.to(torch.float32)


def _blocks(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    pad = (-x.numel()) % BLOCK
    if pad:
        x = torch.cat([x, x.new_zeros(pad)])
    return x.view(-1, BLOCK), pad


def _absmax(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)


def _encode_int8(x: torch.Tensor):
    blocks, _ = _blocks(x)
    scale = _absmax(blocks)
    codes = blocks.mul(127 / scale[:, None]).round_().to(torch.int8)
    return codes.view(-1), scale


def _decode_int8(payload, n: int) -> torch.Tensor:
    codes, scale = payload
    return (codes.view(-1, BLOCK).to(torch.float32) * (scale[:, None] / 127)).view(-1)[:n]


_MAP: torch.Tensor | None = None


def _map() -> torch.Tensor:
    global _MAP
    if _MAP is None:
        _MAP = dynamic_map()
    return _MAP


_PREFIX_SHIFT = 11  # keep a float's exponent and top 12 mantissa bits: 2^20 prefixes, 2^-12 relative steps
_NEAREST: torch.Tensor | None = None


def _nearest_table() -> torch.Tensor:
    """For every 20-bit prefix of a float in [0, 1]: the nearest positive code (-1 for zero), built once."""
    global _NEAREST
    if _NEAREST is None:
        prefixes = torch.arange(2 ** (31 - _PREFIX_SHIFT), dtype=torch.int32)
        middle = ((prefixes << _PREFIX_SHIFT) | (1 << (_PREFIX_SHIFT - 1))).view(torch.float32)
        candidates = torch.cat([torch.zeros(1), _map()[128:]])  # zero, then the 128 positive values
        nearest = torch.bucketize(middle, (candidates[1:] + candidates[:-1]) / 2)
        _NEAREST = (nearest - 1).to(torch.int16)
    return _NEAREST


def _encode_dynamic(x: torch.Tensor):
    """Nearest code by table lookup on the top bits of each normalised magnitude (no search per value)."""
    blocks, _ = _blocks(x)
    scale = _absmax(blocks)
    a = blocks.abs().div_(scale[:, None]).clamp_(max=1.0).view(-1)
    position = _nearest_table()[a.view(torch.int32) >> _PREFIX_SHIFT]
    codes = torch.where(blocks.view(-1) >= 0, 128 + position, 126 - position).clamp_(0, 255)
    return codes.to(torch.uint8), scale


def _decode_dynamic(payload, n: int) -> torch.Tensor:
    codes, scale = payload
    values = _map()[codes.long()].view(-1, BLOCK)
    return (values * scale[:, None]).view(-1)[:n]


CODECS: dict[str, Codec] = {
    "none": Codec("none", lambda x: (x,), lambda p, n: p[0], 32.0, lossy=False),
    "fp16": Codec("fp16", lambda x: (x.to(torch.float16),), lambda p, n: p[0].to(torch.float32), 16.0),
    "bf16": Codec("bf16", lambda x: (x.to(torch.bfloat16),), lambda p, n: p[0].to(torch.float32), 16.0),
    "int8": Codec("int8", _encode_int8, _decode_int8, 8 + 32 / BLOCK),
    "int8-dynamic": Codec("int8-dynamic", _encode_dynamic, _decode_dynamic, 8 + 32 / BLOCK),
}


def get(name: str) -> Codec:
    """A codec by name.

    >>> get("int8").bits_per_value
    8.03125
    """
    if name not in CODECS:
        raise ValueError(f"unknown compression {name!r}; choose one of: {', '.join(CODECS)}")
    return CODECS[name]


def with_error_feedback(codec: Codec, x: torch.Tensor, residual: torch.Tensor | None):
    """Encode ``x`` plus last step's residual; return (payload, new residual).

    The new residual is what this encoding lost; adding it back next step makes
    the sum of decoded values track the sum of true values (EF-SGD, 1-bit SGD).

    >>> payload, residual = with_error_feedback(get("int8"), torch.randn(3000), None)
    >>> residual.shape
    torch.Size([3000])
    """
    corrected = x if residual is None else x + residual
    payload = codec.encode(corrected)
    if not codec.lossy:
        return payload, None
    return payload, corrected - codec.decode(payload, corrected.numel())
