"""Gradient codecs: error bounds on random, heavy-tailed and all-zero inputs; error feedback tracks the truth."""

import pytest
import torch

from gpurig.parallel import codecs

LOSSY = ["fp16", "bf16", "int8", "int8-dynamic"]


def inputs(kind: str, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        return torch.randn(n, generator=g)
    if kind == "heavy":  # Cauchy-like gradients: a few huge values among many tiny ones
        return torch.randn(n, generator=g) / torch.rand(n, generator=g).clamp_min(1e-3) * 1e-3
    if kind == "zeros":
        return torch.zeros(n)
    raise ValueError(kind)


def block_absmax(x):
    blocks, _ = codecs._blocks(x)
    return blocks.abs().amax(dim=1).repeat_interleave(codecs.BLOCK)[: x.numel()]


@pytest.mark.parametrize("kind", ["normal", "heavy", "zeros"])
@pytest.mark.parametrize("n", [1, 1023, 1024, 5000])
@pytest.mark.parametrize("seed", range(3))
def test_error_bounds(kind, n, seed):
    x = inputs(kind, n, seed)
    absmax = block_absmax(x)
    for name in LOSSY:
        codec = codecs.get(name)
        y = codec.decode(codec.encode(x), n)
        assert y.shape == x.shape and y.dtype == torch.float32
        err = (y - x).abs()
        if name == "fp16":
            assert torch.all(err <= x.abs() * 2**-11 + 6e-8)  # half the spacing of fp16, subnormals included
        elif name == "bf16":
            assert torch.all(err <= x.abs() * 2**-8)
        elif name == "int8":
            assert torch.all(err <= absmax / 127 / 2 * 1.0001 + 1e-12)  # half a linear level
        else:  # dynamic: half the widest gap between codes, plus the 2^-12 resolution of the lookup
            gap = (codecs.dynamic_map()[1:] - codecs.dynamic_map()[:-1]).max()
            assert torch.all(err <= absmax * (gap / 2 + 2**-12) + 1e-12)
        if kind == "zeros":
            assert torch.count_nonzero(y) == 0


def test_dynamic_type_is_finer_than_linear_for_small_values():
    """The point of the dynamic type: values far below the block's absmax survive."""
    x = torch.full((1024,), 1e-4)
    x[0] = 1.0
    linear = codecs.get("int8").decode(codecs.get("int8").encode(x), 1024)
    dynamic = codecs.get("int8-dynamic").decode(codecs.get("int8-dynamic").encode(x), 1024)
    assert torch.all(linear[1:] == 0)  # 1e-4 is below half a linear level (1/254)
    assert torch.allclose(dynamic[1:], x[1:], rtol=0.15)  # 4 orders of magnitude down, within 15 %


def test_dynamic_encoding_picks_the_nearest_code():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50_000, generator=g) * torch.exp(torch.randn(50_000, generator=g) * 3)  # 7+ decades
    values = codecs.dynamic_map()
    codes, scale = codecs.get("int8-dynamic").encode(x)
    blocks, _ = codecs._blocks(x)
    normalised = (blocks / scale[:, None]).view(-1)
    brute = (normalised[:, None] - values[None, :]).abs().argmin(1)
    excess = (values[codes.long()] - normalised).abs() - (values[brute] - normalised).abs()
    assert excess.max() <= 2**-12 and (codes.long() != brute).float().mean() < 0.001


def test_payload_sizes():
    x = torch.randn(10 * codecs.BLOCK)
    for name, bytes_per_value in [("none", 4), ("fp16", 2), ("bf16", 2), ("int8", 1 + 4 / codecs.BLOCK),
                                  ("int8-dynamic", 1 + 4 / codecs.BLOCK)]:
        payload = codecs.get(name).encode(x)
        assert sum(t.numel() * t.element_size() for t in payload) == pytest.approx(bytes_per_value * x.numel())


@pytest.mark.parametrize("name", LOSSY)
def test_error_feedback_makes_the_sum_track_the_truth(name):
    codec = codecs.get(name)
    g = torch.Generator().manual_seed(0)
    true_sum, sent_sum, plain_sum, residual = torch.zeros(3000), torch.zeros(3000), torch.zeros(3000), None
    for _ in range(200):
        x = torch.randn(3000, generator=g) * 1e-3 + 1e-5  # a small bias that plain rounding loses
        payload, residual = codecs.with_error_feedback(codec, x, residual)
        true_sum += x
        sent_sum += codec.decode(payload, 3000)
        plain_sum += codec.decode(codec.encode(x), 3000)
    # With feedback the gap never grows beyond one step's error (it is the residual itself).
    assert torch.allclose(sent_sum + residual, true_sum, atol=1e-5)
    assert (sent_sum - true_sum).abs().max() <= (plain_sum - true_sum).abs().max() + 1e-7


def test_unknown_codec_names_the_choices():
    with pytest.raises(ValueError, match="int8-dynamic"):
        codecs.get("int4")
